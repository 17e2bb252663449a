import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { SQSClient } from '@aws-sdk/client-sqs';
import { ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import type { Context, SQSEvent, SQSRecord } from 'aws-lambda';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { createFenceCheckHandler } from '../../functions/fence-check/handler.ts';
import { loadConfig } from '../../functions/platform/config.ts';
import { createProvider } from '../../functions/platform/dependencies.ts';
import { createTelemetry } from '../../functions/platform/observability.ts';
import {
  createQueues,
  createSqsClient,
  deadLetterQueueName,
  QueueName,
  type Queues,
} from '../../functions/platform/queues.ts';
import { createReleaseHandler } from '../../functions/release/handler.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { createQueues as createQueuesOnEndpoint } from '../../infra/local/queue-setup.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { finishedRootRun, insertRun } from '../support/factories.ts';

/**
 * What one invocation does with one batch: the partial batch response is exactly the set of
 * records that must come back, never "everything deleted" after a throw. Records are built by
 * hand so a batch can hold what fauxqs would never deliver together (two records of one FIFO
 * group); the queues behind them are real (fauxqs), as are PostgreSQL and the provisioner.
 */
let t: TestDatabase;
let provisioner: LocalProvisioner;
let sqs: SQSClient;
let queues: Queues;
let stopSqs: () => Promise<void>;
let rootDir: string;
const config = loadConfig({ CLEANUP_RETRY_BASE_SECONDS: '1', CLEANUP_RETRY_MAX_SECONDS: '2' });
const telemetry = createTelemetry({ functionName: 'test', logLevel: 'SILENT' });

beforeAll(async () => {
  t = await createTestDatabase();
  rootDir = await mkdtemp(join(tmpdir(), 'batch-semantics-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 200 });
  const { startFauxqs } = await import('fauxqs');
  const fauxqs = await startFauxqs({ port: 0, host: '127.0.0.1', logger: false });
  stopSqs = () => fauxqs.stop();
  sqs = createSqsClient({ endpoint: `http://127.0.0.1:${fauxqs.port}` });
  await createQueuesOnEndpoint(sqs);
  queues = createQueues({ client: sqs });
});
afterAll(async () => {
  sqs?.destroy();
  await stopSqs?.();
  await provisioner?.stop();
  await rm(rootDir, { recursive: true, force: true });
  await t?.drop();
});

let sequence = 0;
function record(body: string, attributes: Partial<SQSRecord['attributes']> = {}): SQSRecord {
  sequence += 1;
  return {
    messageId: `m-${sequence}`,
    receiptHandle: `not-a-real-receipt-${sequence}`,
    body,
    attributes: {
      ApproximateReceiveCount: '1',
      SentTimestamp: String(Date.now()),
      SenderId: 'test',
      ApproximateFirstReceiveTimestamp: String(Date.now()),
      ...attributes,
    },
    messageAttributes: {},
    md5OfBody: '',
    eventSource: 'aws:sqs',
    eventSourceARN: 'arn:aws:sqs:us-east-1:000000000000:test',
    awsRegion: 'us-east-1',
  };
}

const context = { getRemainingTimeInMillis: () => 60_000 } as Context;

async function receiveAll(queue: string) {
  const url = await queues.url(queue);
  const result = await sqs.send(
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
  const s = await finishedRootRun(t.db, { generation });
  const response = await fetch(`${provisioner.url}/api/sandboxes`, {
    method: 'POST',
    body: JSON.stringify({ sandbox_id: s.sandboxId, thread_id: s.threadId, user_id: s.uid }),
  });
  expect(response.status).toBe(201);
  return s;
}

describe('fence-check batches', () => {
  it('dead-letters the bad records with reasons and processes the valid one in the same batch', async () => {
    const s = await liveSandbox();
    const handler = createFenceCheckHandler({ db: t.db, queues, telemetry, config });
    const bad = [record('{"runId": '), record('{"runId": 42}'), record('{"runId":"ghost-run"}')];
    const good = record(JSON.stringify({ runId: s.rootRunId }));
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
    const handler = createFenceCheckHandler({ db, queues, telemetry, config });
    const records = runs.map((run) => record(JSON.stringify({ runId: run.rootRunId })));
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
    provisioner.setFault(failing.sandboxId, { status: 503 });
    const provider = createProvider(config, provisioner.url);
    const handler = createReleaseHandler({ db: t.db, provider, queues, telemetry, config });
    const fenceSetAt = async (s: typeof failing) => {
      const result = await fenceCheck(t.db, s.rootRunId);
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
    const first = record(command(failing), groupOf(failing));
    const second = record(command(failing), groupOf(failing));
    const other = record(command(healthy), groupOf(healthy));

    const response = await handler({ Records: [first, second, other] } as SQSEvent, context);

    expect(response.batchItemFailures.map((f) => f.itemIdentifier).sort()).toEqual(
      [first.messageId, second.messageId].sort(),
    );
    const deletes = provisioner.audit().filter((entry) => entry.method === 'DELETE');
    // The skipped record of the failed group never reached the provisioner.
    expect(deletes.filter((entry) => entry.sandboxId === failing.sandboxId)).toHaveLength(1);
    expect(
      deletes.filter((entry) => entry.sandboxId === healthy.sandboxId && entry.status === 200),
    ).toHaveLength(1);
    provisioner.clearFaults(failing.sandboxId);
  });
});

describe('the release guard', () => {
  it('skips a release whose fence is gone, and sends a release back to phase 1 while the scope is active', async () => {
    const cleared = await liveSandbox();
    const busy = await liveSandbox();
    const identities = new Map<string, unknown>();
    for (const s of [cleared, busy]) {
      const result = await fenceCheck(t.db, s.rootRunId);
      if (result.outcome !== FenceCheckOutcome.RELEASE_NEEDED) throw new Error('expected a release');
      identities.set(s.rootRunId, { ...result.identity, requestedAt: new Date().toISOString() });
    }
    // After phase 1: one fence is cleared by someone else, one scope gets an active run.
    await t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
      cleared.rootRunId,
    ]);
    await insertRun(t.db, {
      uid: busy.uid,
      conversationId: busy.conversationId,
      threadId: busy.threadId,
      runtimeScopeId: busy.runtimeScopeId,
      status: 'running',
    });
    const auditBefore = provisioner.audit().length;
    const handler = createReleaseHandler({
      db: t.db,
      provider: createProvider(config, provisioner.url),
      queues,
      telemetry,
      config,
    });
    const records = [cleared, busy].map((s) =>
      record(JSON.stringify(identities.get(s.rootRunId)), { MessageGroupId: `${s.uid}:${s.runtimeScopeId}` }),
    );

    const response = await handler({ Records: records } as SQSEvent, context);

    expect(response.batchItemFailures).toEqual([]);
    expect(
      provisioner
        .audit()
        .slice(auditBefore)
        .filter((entry) => entry.method === 'DELETE'),
    ).toEqual([]);
    expect(provisioner.sandbox(cleared.sandboxId)?.alive).toBe(true);
    expect(provisioner.sandbox(busy.sandboxId)?.alive).toBe(true);
    const restarted = (await receiveAll(QueueName.RUN_FINISHED)).map((m) => JSON.parse(m.Body!));
    expect(restarted).toContainEqual(
      expect.objectContaining({ runId: busy.rootRunId, reason: 'scope_active_at_release' }),
    );
    expect(restarted.map((body) => body.runId)).not.toContain(cleared.rootRunId);
  });
});
