/**
 * Hostile queue bodies, property-based (fast-check): malformed JSON, wrong types, quotes and SQL,
 * NUL, lone surrogates, emoji, ~200 KB strings, path-traversal and URL-breaking sandbox ids — alone
 * or planted in an otherwise valid command. Each batch mixes them with one valid message.
 *
 * The handlers are invoked directly with a batch built here (the emulator never returns a chosen
 * mix in one receive), on the real database, provisioner and SQS emulator. Their sends go through
 * `sqsRules`, which applies SQS's own character rule to the body *and every attribute* as SQS does
 * (fauxqs checks only bodies, and wrongly refuses astral characters such as emoji, so the body it
 * stores has those escaped). A dead letter whose reason SQS would refuse is thus a failure here,
 * as it would be in AWS.
 */
import { randomUUID } from 'node:crypto';
import type { Message } from '@aws-sdk/client-sqs';
import type { SQSEvent, SQSRecord } from 'aws-lambda';
import fc from 'fast-check';
import { describe, expect, it, onTestFinished } from 'vitest';
import { QueueUnavailableError } from '../../functions/adapters/errors.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { deadLetterQueueName, type Queues, type SendOptions } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { composeFenceCheck } from '../../functions/fence-check/handler.ts';
import { composeFinalize } from '../../functions/finalize/handler.ts';
import { composeRelease } from '../../functions/release/handler.ts';
import { localLambdaContext } from '../../infra/local/event-source.ts';
import {
  expectedFate,
  FATE_CODES,
  forEmulator,
  HOSTILE_STRINGS,
  hostileBodies,
  hostileMessage,
  hostileText,
  SQS_TEXT,
} from '../chaos/hostile.ts';
import { takeAll } from '../chaos/message-log.ts';
import type { ConsumedQueue } from '../chaos/plan.ts';
import { fenceOf, finishedRootRun } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { testInfrastructure } from '../support/infrastructure.ts';
import { sqsRecord } from '../support/sqs-record.ts';
import { eventually } from '../support/stack.ts';

const fixture = useStackFixture();

interface Sent {
  queue: string;
  body: string;
  attributes: Record<string, string>;
}

/** Sends the emulator refused, for the failure message of a property. */
const sendFailures: string[] = [];

/** The stack's queues, with SQS's validation of every text it sends. */
function sqsRules(inner: Queues, sent: Sent[]): Queues {
  return {
    ...inner,
    async send(queue: string, body: unknown, options: SendOptions = {}) {
      const text = typeof body === 'string' ? body : JSON.stringify(body);
      const attributes = options.attributes ?? {};
      for (const [name, value] of [['body', text], ...Object.entries(attributes)] as const) {
        if (!SQS_TEXT.test(value)) {
          throw new QueueUnavailableError(
            `SQS SendMessage on ${queue} failed: InvalidMessageContents in ${name}`,
            {
              queue,
            },
          );
        }
      }
      try {
        const id = await inner.send(queue, forEmulator(text), options);
        sent.push({ queue, body: text, attributes });
        return id;
      } catch (error) {
        sendFailures.push(`${queue}: ${(error as Error).message.slice(0, 300)} (body ${text.length} chars)`);
        throw error;
      }
    },
  };
}

/** Bodies SQS can deliver: its character set (anything else never reaches a consumer). */
const deliverable = (body: string) =>
  body.replace(/[^\t\n\r\u0020-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/gu, '?') || '?';

/** A record of `queue` as its event source would deliver it: on the FIFO queue, in `groupId`. */
function record(queue: ConsumedQueue, body: string, groupId: string): SQSRecord {
  return sqsRecord(body, {
    queue,
    attributes:
      queue === 'runtime-release.fifo'
        ? { MessageGroupId: groupId, MessageDeduplicationId: randomUUID() }
        : {},
  });
}

/** A valid message for the queue, about a fresh fenced run, and what its processing must show. */
async function validMessage(
  queue: ConsumedQueue,
  sent: Sent[],
): Promise<{ body: string; groupId: string; done: () => Promise<void> }> {
  const s = await finishedRootRun(fixture.t.db);
  const groupId = `${s.uid}:${s.runtimeScopeId}`;
  const publishedFor = (target: string) =>
    sent.some((m) => m.queue === target && m.body.includes(s.rootRunId));
  if (queue === 'run-finished') {
    return {
      body: JSON.stringify({ runId: s.rootRunId }),
      groupId,
      done: async () => expect(publishedFor('runtime-release.fifo')).toBe(true),
    };
  }
  const checked = await fenceCheck(fixture.t.db, s.rootRunId);
  if (checked.outcome !== FenceCheckOutcome.RELEASE_NEEDED) throw new Error(`unexpected ${checked.outcome}`);
  if (queue === 'runtime-release.fifo') {
    return {
      body: JSON.stringify({ ...checked.identity, requestedAt: new Date().toISOString() }),
      groupId,
      // No sandbox exists at the provisioner for this run: the delete answers 404, then finalize.
      done: async () => expect(publishedFor('runtime-finalize')).toBe(true),
    };
  }
  return {
    body: JSON.stringify({
      ...checked.identity,
      releaseOutcome: 'absent',
      releasedAt: new Date().toISOString(),
    }),
    groupId,
    done: async () => expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false),
  };
}

async function tableCounts(): Promise<Record<string, number>> {
  const { rows } = await fixture.t.db.query<{ name: string; n: number }>(
    `SELECT 'agent_runs' AS name, count(*)::int AS n FROM agent_runs
     UNION ALL SELECT 'conversations', count(*)::int FROM conversations
     UNION ALL SELECT 'sandbox_runtimes', count(*)::int FROM sandbox_runtimes`,
  );
  return Object.fromEntries(rows.map((row) => [row.name, row.n]));
}

describe('hostile queue bodies', () => {
  for (const queue of ['run-finished', 'runtime-release.fifo', 'runtime-finalize'] as const) {
    it(`${queue}: each hostile body is dead-lettered at once with a reason SQS accepts, and the valid message of the same batch is processed`, async () => {
      const sent: Sent[] = [];
      const infrastructure = testInfrastructure({
        config: { ...fixture.stack.config, provisionerUrl: fixture.stack.provisionerUrl },
        db: fixture.stack.db,
        queues: sqsRules(fixture.stack.queues, sent),
        telemetry: createTelemetry({
          functionName: 'hostile-input-test',
          logLevel: process.env.HOSTILE_LOG ?? 'SILENT',
        }),
      });
      const compose =
        queue === 'run-finished'
          ? composeFenceCheck
          : queue === 'runtime-release.fifo'
            ? composeRelease
            : composeFinalize;
      const composed = await compose(infrastructure);
      onTestFinished(() => composed.close());
      const { handler } = composed;
      const before = await tableCounts();

      await fc.assert(
        fc.asyncProperty(
          fc.array(hostileBodies[queue].map(deliverable), { minLength: 1, maxLength: 5 }),
          fc.nat(),
          async (bodies, position) => {
            const valid = await validMessage(queue, sent);
            const hostile = bodies.map((body, i) => ({
              body,
              record: record(queue, body, `hostile-${i}-${randomUUID()}`),
            }));
            const records = hostile.map((h) => h.record);
            const validRecord = record(queue, valid.body, valid.groupId);
            records.splice(position % (records.length + 1), 0, validRecord);

            const response = await handler(
              { Records: records } satisfies SQSEvent,
              localLambdaContext('hostile-input-test', 30),
            );

            expect(response.batchItemFailures, sendFailures.join('\n')).toEqual([]);
            const letters = sent.filter((m) => m.queue === deadLetterQueueName(queue));
            for (const { body, record: r } of hostile) {
              const mine = letters.filter((m) => m.attributes.sourceMessageId === r.messageId);
              expect(mine).toHaveLength(1);
              expect(FATE_CODES[expectedFate(queue, body)]).toContain(mine[0]!.attributes.errorCode);
              expect(mine[0]!.attributes.reason?.length).toBeGreaterThan(0);
              expect(mine[0]!.attributes.sourceQueue).toBe(queue);
            }
            expect(letters.filter((m) => m.attributes.sourceMessageId === validRecord.messageId)).toEqual([]);
            await valid.done();
          },
        ),
        { numRuns: 25, seed: 20261130 },
      );

      // Nothing was dropped or emptied by a body that tried to; only the test's own rows were added.
      const after = await tableCounts();
      for (const [table, n] of Object.entries(before)) expect(after[table]).toBeGreaterThanOrEqual(n);
    });
  }

  it('a dead-letter reason stays valid SQS text when the body’s echo is cut inside an emoji', async () => {
    // V8's JSON.parse message quotes the start of the body and cuts it by UTF-16 units, which can
    // split a surrogate pair; the reason then holds a lone surrogate, which SQS refuses in a message
    // attribute — the dead letter would fail and the message be retried instead of parked.
    const sent: Sent[] = [];
    const { handler } = await composeFenceCheck(
      testInfrastructure({
        config: fixture.stack.config,
        db: fixture.stack.db,
        queues: sqsRules(fixture.stack.queues, sent),
        telemetry: createTelemetry({ functionName: 'hostile-input-test', logLevel: 'SILENT' }),
      }),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 60 }),
        fc.constantFrom('x', 'ab', '{'),
        async (count, prefix) => {
          const body = `${prefix}${'😀'.repeat(count)}`;
          const r = record('run-finished', body, 'unused');
          const response = await handler({ Records: [r] }, localLambdaContext('hostile-input-test', 30));
          expect(response.batchItemFailures).toEqual([]);
          const letter = sent.find((m) => m.attributes.sourceMessageId === r.messageId);
          expect(letter?.attributes.errorCode).toBe('MESSAGE_INVALID');
          expect(letter?.attributes.reason).toMatch(SQS_TEXT);
        },
      ),
      { numRuns: 30, seed: 7 },
    );
  });

  it('through the real event sources: hostile messages land in their DLQs with reason and errorCode, and the stack keeps cleaning up', async () => {
    const samples = fc.sample(hostileMessage, { numRuns: 18, seed: 42 });
    const sentIds = new Map<string, { queue: ConsumedQueue; body: string }>();
    for (const { queue, body } of samples) {
      const id = await fixture.stack.queues.send(
        queue,
        body,
        queue === 'runtime-release.fifo'
          ? { groupId: `hostile-${randomUUID()}`, deduplicationId: randomUUID() }
          : {},
      );
      sentIds.set(id, { queue, body });
    }
    const scope = await fixture.stack.platform.createScope();
    const run = (await fixture.stack.platform.admitRootRun(scope))!;
    await fixture.stack.platform.finishRun(run.runId, 'completed');
    await eventually(
      'the valid run sent after the hostile ones is cleaned up',
      async () => !(await fenceOf(fixture.t.db, run.runId)),
    );

    const expectedLetters = [...sentIds.entries()];
    // Taken off the DLQs (and kept) as they arrive: a peek sees at most one receive's worth.
    const letters = new Map<string | undefined, Message>();
    await eventually('every hostile message is dead-lettered', async () => {
      for (const queue of ['run-finished', 'runtime-release.fifo', 'runtime-finalize']) {
        for (const message of await takeAll(
          fixture.stack.sqs,
          fixture.stack.queueUrl(deadLetterQueueName(queue)),
        )) {
          letters.set(message.MessageAttributes?.sourceMessageId?.StringValue, message);
        }
      }
      return expectedLetters.every(([id]) => letters.has(id));
    });
    for (const [id, { queue, body }] of expectedLetters) {
      const attributes = letters.get(id)!.MessageAttributes!;
      expect(FATE_CODES[expectedFate(queue, body)]).toContain(attributes.errorCode?.StringValue);
      expect(attributes.reason?.StringValue?.length).toBeGreaterThan(0);
      expect(attributes.sourceQueue?.StringValue).toBe(queue);
    }
    expect(fixture.stack.errors).toEqual([]);
  });
});

describe('hostile sandbox ids at the provisioner', () => {
  it('reach the provisioner percent-encoded as one path segment, or are refused before any request', async () => {
    const client = new ProvisionerClient(fixture.stack.provisionerUrl);
    const provisioner = fixture.stack.provisioner!;
    try {
      await fc.assert(
        fc.asyncProperty(
          fc.oneof(
            fc.constantFrom(...HOSTILE_STRINGS),
            hostileText.filter((s) => s.length <= 600),
          ),
          async (id) => {
            const before = provisioner.audit().length;
            let refused = false;
            try {
              await client.deleteSandbox({ sandboxId: id, generation: 1, deleteTimeoutMs: 5_000 });
            } catch (error) {
              expect((error as { code?: string }).code).toBe('MESSAGE_INVALID');
              refused = true;
            }
            const requests = provisioner.audit().slice(before);
            if (refused) {
              expect(requests).toEqual([]);
              return;
            }
            // The 404 is checked by a listing taken after it (provisioner-client.ts, #confirmAbsence).
            const others = requests.filter(({ method }) => method !== 'DELETE');
            expect(others.length).toBeGreaterThanOrEqual(1);
            for (const other of others) expect(`${other.method} ${other.path}`).toBe('GET /api/sandboxes');
            const deletes = requests.filter(({ method }) => method === 'DELETE');
            expect(deletes).toHaveLength(1);
            const [request] = deletes;
            const segment = request!.path.slice('/api/sandboxes/'.length);
            expect(request!.path.startsWith('/api/sandboxes/')).toBe(true);
            expect(segment).not.toContain('/');
            expect(segment).not.toMatch(/^\.{1,2}$/);
            expect(decodeURIComponent(segment)).toBe(id);
            expect(request!.sandboxId).toBe(id);
            // A sandbox nobody created: 404, never a control route's answer nor another sandbox's.
            expect(request!.status).toBe(404);
          },
        ),
        { numRuns: 120, seed: 11 },
      );
    } finally {
      await client.close();
    }
  });
});
