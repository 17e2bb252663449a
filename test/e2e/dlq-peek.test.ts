/**
 * `ops dlq` and `ops explain` list every dead letter they can, against a real SQS emulator:
 * letters are received with a short visibility, page after page until the queue has nothing more,
 * then made visible again (a VisibilityTimeout-0 peek saw the same first ten again and again).
 * When the listing cannot be complete — letters hidden by someone else, letters of a FIFO group
 * behind its first (SQS hands them out only once those are deleted) — the output says so and
 * how many of how many were seen. Nothing is consumed, and FIFO order is kept.
 */
import { randomUUID } from 'node:crypto';
import {
  GetQueueAttributesCommand,
  PurgeQueueCommand,
  ReceiveMessageCommand,
  SendMessageCommand,
} from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { ChildRun } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { finishedRootRun } from '../support/factories.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { type SqsEmulator, startSqsEmulator } from '../support/sqs-emulator.ts';

const STANDARD_DLQ = 'run-finished-dlq';
const FIFO_DLQ = 'runtime-release-dlq.fifo';

let t: TestDatabase;
let sqs: SqsEmulator;
beforeAll(async () => {
  t = await createTestDatabase();
  sqs = await startSqsEmulator();
});
afterAll(async () => {
  await sqs?.stop();
  await t?.drop();
});
beforeEach(async () => {
  for (const name of [STANDARD_DLQ, FIFO_DLQ]) {
    await sqs.client.send(new PurgeQueueCommand({ QueueUrl: url(name) }));
  }
});

const url = (name: string) => sqs.queues.get(name)!.url;

function ops(args: string[]): Promise<ChildRun> {
  const env: NodeJS.ProcessEnv = {
    DATABASE_URL: t.url,
    DATABASE_WS_PROXY: t.wsProxy,
    AWS_ENDPOINT_URL_SQS: sqs.endpoint,
    QUEUE_NAME_PREFIX: '',
  };
  return runOpsCli(args, { env, timeoutMs: 60_000 });
}

/** A dead letter as batch.ts writes one: the body, and the reason as attributes. */
async function deadLetter(
  queue: string,
  runId: string,
  options: { group?: string; errorCode?: string } = {},
) {
  const attribute = (value: string) => ({ DataType: 'String', StringValue: value });
  await sqs.client.send(
    new SendMessageCommand({
      QueueUrl: url(queue),
      MessageBody: JSON.stringify({ runId, n: randomUUID() }),
      MessageAttributes: {
        reason: attribute(`failed ${options.errorCode ?? 'PROVISIONER_REJECTED'}`),
        errorCode: attribute(options.errorCode ?? 'PROVISIONER_REJECTED'),
        sourceMessageId: attribute(randomUUID()),
        receiveCount: attribute('8'),
        deadLetteredAt: attribute(new Date().toISOString()),
      },
      ...(queue.endsWith('.fifo')
        ? { MessageGroupId: options.group ?? 'g', MessageDeduplicationId: randomUUID() }
        : {}),
    }),
  );
}

async function visibleCount(queue: string): Promise<number> {
  const { Attributes } = await sqs.client.send(
    new GetQueueAttributesCommand({ QueueUrl: url(queue), AttributeNames: ['ApproximateNumberOfMessages'] }),
  );
  return Number(Attributes?.ApproximateNumberOfMessages ?? 0);
}

interface DlqReport {
  deadLetterQueue: string;
  messages: number;
  peeked: number;
  complete: boolean;
  incompleteBecause: string | null;
  reasons: Array<{ errorCode: string | null; count: number }>;
}

async function dlqReport(queue: string): Promise<DlqReport> {
  const run = await ops(['dlq', '--json']);
  expect(run.code, run.stderr).toBe(0);
  return (JSON.parse(run.stdout) as { queues: DlqReport[] }).queues.find((q) => q.deadLetterQueue === queue)!;
}

describe('ops dlq', () => {
  it('lists every letter of a standard DLQ beyond one receive, and leaves them all there', async () => {
    for (let i = 0; i < 23; i += 1) await deadLetter(STANDARD_DLQ, `run-${i}`);
    const report = await dlqReport(STANDARD_DLQ);
    expect(report).toMatchObject({ messages: 23, peeked: 23, complete: true, incompleteBecause: null });
    expect(await visibleCount(STANDARD_DLQ)).toBe(23);
  });

  it("on a FIFO DLQ sees every group, says the letters behind each group's first are not shown, and keeps the order", async () => {
    for (const [group, count] of [
      ['a', 4],
      ['b', 1],
      ['c', 3],
    ] as const) {
      for (let i = 0; i < count; i += 1) {
        await deadLetter(FIFO_DLQ, `run-${group}`, {
          group,
          errorCode: i === 0 ? 'GENERATION_ANOMALY' : 'PROVISIONER_REJECTED',
        });
      }
    }
    const report = await dlqReport(FIFO_DLQ);
    expect(report.messages).toBe(8);
    // fauxqs hands out one letter per group per receive (AWS: up to ten): at least every group.
    expect(report.peeked).toBeGreaterThanOrEqual(3);
    expect(report.peeked).toBeLessThan(8);
    expect(report.complete).toBe(false);
    expect(report.incompleteBecause).toContain(`${report.peeked} of about 8 letters seen`);
    expect(report.incompleteBecause).toContain('wait behind the first letter of their FIFO message group');
    expect(await visibleCount(FIFO_DLQ)).toBe(8);
    // Still in group order: the first letter of group a comes first again.
    const { Messages } = await sqs.client.send(
      new ReceiveMessageCommand({
        QueueUrl: url(FIFO_DLQ),
        MaxNumberOfMessages: 10,
        VisibilityTimeout: 0,
        MessageAttributeNames: ['All'],
      }),
    );
    const firstOfA = Messages?.find((m) => JSON.parse(m.Body!).runId === 'run-a');
    expect(firstOfA?.MessageAttributes?.errorCode?.StringValue).toBe('GENERATION_ANOMALY');
    const text = await ops(['dlq']);
    expect(text.stdout).toContain(`${FIFO_DLQ} (the listing may be incomplete: ${report.peeked} of about 8`);
  });

  it('says the listing may be incomplete when someone else holds letters hidden', async () => {
    for (let i = 0; i < 5; i += 1) await deadLetter(STANDARD_DLQ, `run-${i}`);
    await sqs.client.send(
      new ReceiveMessageCommand({
        QueueUrl: url(STANDARD_DLQ),
        MaxNumberOfMessages: 2,
        VisibilityTimeout: 120,
      }),
    );
    const report = await dlqReport(STANDARD_DLQ);
    expect(report.messages).toBe(5);
    expect(report.peeked).toBe(3);
    expect(report.complete).toBe(false);
    expect(report.incompleteBecause).toContain(
      '2 were hidden by someone else (a peek or a redrive in progress)',
    );
    const text = await ops(['dlq']);
    expect(text.stdout).toContain(
      `${STANDARD_DLQ} (the listing may be incomplete: 3 of about 5 letters seen`,
    );
  });
});

describe('ops explain', () => {
  it("shows the run's letters from several groups and queues, and says when a FIFO group may hold more", async () => {
    const scenario = await finishedRootRun(t.db);
    await deadLetter(STANDARD_DLQ, scenario.rootRunId, { errorCode: 'SCOPE_MISMATCH' });
    await deadLetter(STANDARD_DLQ, scenario.rootRunId, { errorCode: 'MALFORMED' });
    await deadLetter(FIFO_DLQ, scenario.rootRunId, {
      group: `${scenario.uid}:${scenario.runtimeScopeId}`,
      errorCode: 'GENERATION_ANOMALY',
    });
    await deadLetter(FIFO_DLQ, scenario.rootRunId, {
      group: `${scenario.uid}:${scenario.runtimeScopeId}`,
      errorCode: 'PROVISIONER_REJECTED',
    });
    for (let i = 0; i < 12; i += 1) await deadLetter(STANDARD_DLQ, `another-run-${i}`);
    const run = await ops(['explain', scenario.rootRunId, '--json']);
    expect(run.code, run.stderr).toBe(0);
    const explanation = JSON.parse(run.stdout) as {
      deadLetters: Array<{ errorCode: string }>;
      deadLettersComplete: boolean;
      deadLettersIncomplete: string | null;
    };
    const codes = explanation.deadLetters.map((letter) => letter.errorCode);
    expect(codes).toEqual(expect.arrayContaining(['SCOPE_MISMATCH', 'MALFORMED', 'GENERATION_ANOMALY']));
    expect(explanation.deadLettersComplete).toBe(false);
    expect(explanation.deadLettersIncomplete).toContain(`${FIFO_DLQ}: `);
    expect(explanation.deadLettersIncomplete).not.toContain(`${STANDARD_DLQ}: `);
    const text = await ops(['explain', scenario.rootRunId]);
    expect(text.stdout).toContain('(the listing may be incomplete: runtime-release-dlq.fifo: ');
    expect(await visibleCount(STANDARD_DLQ)).toBe(14);
    expect(await visibleCount(FIFO_DLQ)).toBe(2);
  });
});
