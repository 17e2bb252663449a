/**
 * What one invocation does with one batch: the partial batch response is exactly the set of
 * records that must come back, never "everything deleted" after a throw. Records are built by
 * hand so a batch can hold what fauxqs would never deliver together (two records of one FIFO
 * group); the queues behind them are real (fauxqs), as are PostgreSQL and the provisioner.
 */
import { ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import type { Context, SQSEvent } from 'aws-lambda';
import { describe, expect, it, onTestFinished } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import type { Database } from '../../functions/adapters/database.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import type { Queues } from '../../functions/adapters/queues.ts';
import { deadLetterQueueName, QueueName } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { composeFenceCheck } from '../../functions/fence-check/handler.ts';
import { composeRelease } from '../../functions/release/handler.ts';
import type { RetryAfterFault } from '../../infra/local/provisioner/faults.ts';
import { createTestDatabase } from '../support/database.ts';
import { finishedRootRun, insertOtherRun } from '../support/factories.ts';
import { useProvisionerFixture, useSqsFixture } from '../support/fixtures.ts';
import { testInfrastructure } from '../support/infrastructure.ts';
import { sqsRecord } from '../support/sqs-record.ts';
import { eventually } from '../support/stack.ts';

const fixture = useProvisionerFixture({ tempPrefix: 'batch-semantics-', graceMs: 200 });
const sqsFixture = useSqsFixture();
const config = loadConfig({ CLEANUP_RETRY_BASE_SECONDS: '1', CLEANUP_RETRY_MAX_SECONDS: '2' });
const telemetry = createTelemetry({ functionName: 'test', logLevel: 'SILENT' });

const context = { getRemainingTimeInMillis: () => 60_000 } as Context;

/** The functions as their composition roots wire them, on the file's database, queues and provisioner. */
async function fenceCheckHandler(db: Database = fixture.t.db) {
  const infrastructure = testInfrastructure({ config, db, queues: sqsFixture.queues, telemetry });
  return (await composeFenceCheck(infrastructure)).handler;
}
async function releaseHandler() {
  const infrastructure = testInfrastructure({
    config: { ...config, provisionerUrl: fixture.provisioner.url },
    db: fixture.t.db,
    queues: sqsFixture.queues,
    telemetry,
  });
  const release = await composeRelease(infrastructure);
  onTestFinished(() => release.close());
  return release.handler;
}

async function receiveAll(queue: string) {
  const url = await sqsFixture.queues.url(queue);
  const result = await sqsFixture.sqs.send(
    new ReceiveMessageCommand({
      QueueUrl: url,
      MaxNumberOfMessages: 10,
      MessageAttributeNames: ['All'],
      VisibilityTimeout: 0,
    }),
  );
  return result.Messages ?? [];
}

async function liveSandbox(generation = 1) {
  const s = await finishedRootRun(fixture.t.db, { generation });
  const response = await fetch(`${fixture.provisioner.url}/api/sandboxes`, {
    method: 'POST',
    body: JSON.stringify({ sandbox_id: s.sandboxId, thread_id: s.threadId, user_id: s.uid }),
  });
  expect(response.status).toBe(201);
  return s;
}

describe('fence-check batches', () => {
  it('dead-letters the bad records with reasons and processes the valid one in the same batch', async () => {
    const s = await liveSandbox();
    const handler = await fenceCheckHandler();
    const bad = [sqsRecord('{"runId": '), sqsRecord('{"runId": 42}'), sqsRecord('{"runId":"ghost-run"}')];
    const good = sqsRecord(JSON.stringify({ runId: s.rootRunId }));
    const response = await handler({ Records: [...bad, good] } as SQSEvent, context);

    expect(response.batchItemFailures).toEqual([]);
    const dead = await receiveAll(deadLetterQueueName(QueueName.RUN_FINISHED));
    const reasons = Object.fromEntries(
      dead.map((m) => [m.Body, m.MessageAttributes?.errorCode?.StringValue]),
    );
    expect(reasons).toEqual({
      '{"runId": ': 'MESSAGE_INVALID',
      '{"runId": 42}': 'MESSAGE_INVALID',
      '{"runId":"ghost-run"}': 'RUN_NOT_FOUND',
    });
    const releases = await receiveAll(QueueName.RUNTIME_RELEASE);
    expect(releases.map((m) => JSON.parse(m.Body!).runId)).toContain(s.rootRunId);
  });

  it('reports every record as failed when every record fails retryably — never an empty response', async () => {
    const broken = await createTestDatabase();
    const runs = [await finishedRootRun(broken.db), await finishedRootRun(broken.db)];
    const db = await broken.connect();
    await db.end(); // a database that can no longer be reached: every record fails, retryably
    const handler = await fenceCheckHandler(db);
    const records = runs.map((run) => sqsRecord(JSON.stringify({ runId: run.rootRunId })));
    const response = await handler({ Records: records } as SQSEvent, context);
    expect(response.batchItemFailures.map((f) => f.itemIdentifier).sort()).toEqual(
      records.map((r) => r.messageId).sort(),
    );
    await broken.drop();
  });
});

describe('release batches on the FIFO queue', () => {
  it('fails the rest of a failed group unprocessed while other groups proceed', async () => {
    const failing = await liveSandbox();
    const healthy = await liveSandbox();
    fixture.provisioner.setFault(failing.sandboxId, { status: 503 });
    const handler = await releaseHandler();
    const fenceSetAt = async (s: typeof failing) => {
      const result = await fenceCheck(fixture.t.db, s.rootRunId);
      return result.outcome === FenceCheckOutcome.RELEASE_NEEDED ? result.identity.fenceSetAt : null;
    };
    const fences = new Map([
      [failing.rootRunId, await fenceSetAt(failing)],
      [healthy.rootRunId, await fenceSetAt(healthy)],
    ]);
    const command = (s: typeof failing) =>
      JSON.stringify({
        runId: s.rootRunId,
        uid: s.uid,
        runtimeScopeId: s.runtimeScopeId,
        workdirPath: s.workdirPath,
        sandboxId: s.sandboxId,
        generation: s.generation,
        fenceSetAt: fences.get(s.rootRunId),
        requestedAt: new Date().toISOString(),
      });
    const groupOf = (s: typeof failing) => ({ MessageGroupId: `${s.uid}:${s.runtimeScopeId}` });
    const first = sqsRecord(command(failing), { attributes: groupOf(failing) });
    const second = sqsRecord(command(failing), { attributes: groupOf(failing) });
    const other = sqsRecord(command(healthy), { attributes: groupOf(healthy) });

    const response = await handler({ Records: [first, second, other] } as SQSEvent, context);

    expect(response.batchItemFailures.map((f) => f.itemIdentifier).sort()).toEqual(
      [first.messageId, second.messageId].sort(),
    );
    const deletes = fixture.provisioner.audit().filter((entry) => entry.method === 'DELETE');
    // The skipped record of the failed group never reached the provisioner.
    expect(deletes.filter((entry) => entry.sandboxId === failing.sandboxId)).toHaveLength(1);
    expect(
      deletes.filter((entry) => entry.sandboxId === healthy.sandboxId && entry.status === 200),
    ).toHaveLength(1);
    fixture.provisioner.clearFaults(failing.sandboxId);
  });
});

describe('a Retry-After sets the retry delay (contract v1.1 §3)', () => {
  /**
   * Records every retry delay the consumer asks SQS for, then passes the call on to the real
   * queue (which refuses these hand-made receipt handles; the consumer only logs that).
   */
  function observingVisibility(): { queues: Queues; delays: Map<string, number> } {
    const real = sqsFixture.queues;
    const delays = new Map<string, number>();
    return {
      delays,
      queues: {
        send: (queue, body, options) => real.send(queue, body, options),
        url: (queue) => real.url(queue),
        async changeVisibility(queue, receiptHandle, seconds) {
          delays.set(receiptHandle, seconds);
          await real.changeVisibility(queue, receiptHandle, seconds);
        },
        get stats() {
          return real.stats;
        },
        get client() {
          return real.client;
        },
      },
    };
  }

  async function releaseBatchAgainst(retryAfter: RetryAfterFault) {
    const throttled = await liveSandbox();
    fixture.provisioner.setFault(throttled.sandboxId, { status: 429, retryAfter });
    const capped = loadConfig({ CLEANUP_RETRY_BASE_SECONDS: '1', CLEANUP_RETRY_MAX_SECONDS: '10' });
    const { queues, delays } = observingVisibility();
    const release = await composeRelease(
      testInfrastructure({
        config: { ...capped, provisionerUrl: fixture.provisioner.url },
        db: fixture.t.db,
        queues,
        telemetry,
      }),
    );
    onTestFinished(() => release.close());
    const handler = release.handler;
    const phase1 = await fenceCheck(fixture.t.db, throttled.rootRunId);
    if (phase1.outcome !== FenceCheckOutcome.RELEASE_NEEDED) throw new Error('expected a release');
    const body = JSON.stringify({ ...phase1.identity, requestedAt: new Date().toISOString() });
    const group = { MessageGroupId: `${throttled.uid}:${throttled.runtimeScopeId}` };
    const first = sqsRecord(body, { attributes: group });
    const skipped = sqsRecord(body, { attributes: group });

    const response = await handler({ Records: [first, skipped] } as SQSEvent, context);

    fixture.provisioner.clearFaults(throttled.sandboxId);
    expect(response.batchItemFailures.map((f) => f.itemIdentifier).sort()).toEqual(
      [first.messageId, skipped.messageId].sort(),
    );
    return { failed: delays.get(first.receiptHandle), skipped: delays.get(skipped.receiptHandle) };
  }

  it("waits as long as the 429 asks, beyond the backoff, and the group's skipped record waits as long", async () => {
    // Backoff of a first receive with a 1 s base is 1 s; the provisioner asks for 7.
    expect(await releaseBatchAgainst({ seconds: 7, as: 'delta-seconds' })).toEqual({ failed: 7, skipped: 7 });
  });

  it('reads an HTTP-date the same way', async () => {
    const delays = await releaseBatchAgainst({ seconds: 6, as: 'http-date' });
    expect(delays.failed).toBeGreaterThanOrEqual(5);
    expect(delays.failed).toBeLessThanOrEqual(7);
    expect(delays.skipped).toBe(delays.failed);
  });

  it('never waits beyond CLEANUP_RETRY_MAX_SECONDS, however long the provisioner asks for', async () => {
    expect(await releaseBatchAgainst({ seconds: 86_400, as: 'delta-seconds' })).toEqual({
      failed: 10,
      skipped: 10,
    });
  });

  it.each(['-5', 'garbage', 'Sun, 06 Nov 1994 08:49:37 GMT', '0'])(
    'falls back to the backoff for a hostile or past Retry-After (%s)',
    async (retryAfter) => {
      expect(await releaseBatchAgainst(retryAfter)).toEqual({ failed: 1, skipped: 1 });
    },
  );
});

describe('the release guard', () => {
  it('skips a release whose fence is gone, and sends a release back to phase 1 while the scope is active', async () => {
    const cleared = await liveSandbox();
    const busy = await liveSandbox();
    const identities = new Map<string, unknown>();
    for (const s of [cleared, busy]) {
      const result = await fenceCheck(fixture.t.db, s.rootRunId);
      if (result.outcome !== FenceCheckOutcome.RELEASE_NEEDED) throw new Error('expected a release');
      identities.set(s.rootRunId, { ...result.identity, requestedAt: new Date().toISOString() });
    }
    // After phase 1: one fence is cleared by someone else, one scope gets an active run.
    await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
      cleared.rootRunId,
    ]);
    await insertOtherRun(fixture.t.db, busy, { status: 'running' });
    const auditBefore = fixture.provisioner.audit().length;
    const handler = await releaseHandler();
    const records = [cleared, busy].map((s) =>
      sqsRecord(JSON.stringify(identities.get(s.rootRunId)), {
        attributes: { MessageGroupId: `${s.uid}:${s.runtimeScopeId}` },
      }),
    );

    const response = await handler({ Records: records } as SQSEvent, context);

    expect(response.batchItemFailures).toEqual([]);
    expect(
      fixture.provisioner
        .audit()
        .slice(auditBefore)
        .filter((entry) => entry.method === 'DELETE'),
    ).toEqual([]);
    expect(fixture.provisioner.sandbox(cleared.sandboxId)?.alive).toBe(true);
    expect(fixture.provisioner.sandbox(busy.sandboxId)?.alive).toBe(true);
    // The restart is counted and waits its backoff delay (1 s here).
    const restarted: Array<{ runId: string; reason?: string; restarts?: number }> = [];
    await eventually('the restart to arrive', async () => {
      restarted.push(...(await receiveAll(QueueName.RUN_FINISHED)).map((m) => JSON.parse(m.Body!)));
      return restarted.length > 0;
    });
    expect(restarted).toContainEqual(
      expect.objectContaining({ runId: busy.rootRunId, reason: 'scope_active_at_release', restarts: 1 }),
    );
    expect(restarted.map((body) => body.runId)).not.toContain(cleared.rootRunId);
  });
});
