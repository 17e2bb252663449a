import { ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import type { Context } from 'aws-lambda';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import type { ReleaseCommand } from '../../functions/adapters/messages.ts';
import { MetricName } from '../../functions/adapters/metric-names.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import { deadLetterQueueName, QueueName } from '../../functions/adapters/queues.ts';
import { ErrorCode } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { createProvider, createReleaseHandler } from '../../functions/release/handler.ts';
import { captureStdout, emfMetrics } from '../support/capture.ts';
import { insertOtherRun } from '../support/factories.ts';
import { useProvisionerFixture, useSqsFixture } from '../support/fixtures.ts';
import { type ProvisionedRun, provisionedRootRun, releaseNeeded } from '../support/probes.ts';
import { sqsRecord } from '../support/sqs-record.ts';
import { eventually } from '../support/stack.ts';

/**
 * Issue 11.2 through the real release handler: a forged or mismatched release command is refused
 * before any DELETE reaches the provisioner, dead-lettered at once with its own reason code, and
 * counted (DeadLettered by reason). Real PostgreSQL, real queues (fauxqs), a real provisioner
 * whose audit shows every request it received.
 */
const fixture = useProvisionerFixture({ tempPrefix: 'release-refusals-', graceMs: 200 });
const sqsFixture = useSqsFixture();
const config = loadConfig({ CLEANUP_RETRY_BASE_SECONDS: '1', CLEANUP_RETRY_MAX_SECONDS: '2' });
const context = { getRemainingTimeInMillis: () => 60_000 } as Context;

beforeAll(() => {
  process.env.POWERTOOLS_METRICS_DISABLED = 'false';
});
afterAll(() => {
  process.env.POWERTOOLS_METRICS_DISABLED = 'true';
});

async function commandFor(run: ProvisionedRun): Promise<ReleaseCommand> {
  const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
  return {
    ...identity,
    sandboxId: identity.sandboxId!,
    generation: identity.generation!,
    requestedAt: new Date().toISOString(),
  };
}

async function drain(queue: string): Promise<Array<{ body: string; errorCode: string | undefined }>> {
  const url = await sqsFixture.queues.url(queue);
  const taken: Array<{ body: string; errorCode: string | undefined }> = [];
  for (;;) {
    const { Messages = [] } = await sqsFixture.sqs.send(
      new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10, MessageAttributeNames: ['All'] }),
    );
    if (!Messages.length) return taken;
    taken.push(
      ...Messages.map((m) => ({ body: m.Body!, errorCode: m.MessageAttributes?.errorCode?.StringValue })),
    );
  }
}

describe('forged and mismatched release commands', () => {
  it('are refused before any DELETE, each dead-lettered with its own code and counted by it', async () => {
    const mine = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const other = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const valid = await commandFor(mine);
    const otherValid = await commandFor(other);
    const child = await insertOtherRun(fixture.t.db, mine, {
      runType: 'subagent',
      createdByRunId: mine.rootRunId,
      status: 'completed',
    });
    const stillRunning = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const stillRunningCommand = await commandFor(stillRunning);
    await fixture.t.db.query(`UPDATE agent_runs SET status = 'running' WHERE id = $1::text`, [
      stillRunning.rootRunId,
    ]);

    const forged: Array<[string, ReleaseCommand]> = [
      // Another scope's real sandbox, under this run's id: deleting it would take a stranger's sandbox.
      [
        ErrorCode.RELEASE_SCOPE_MISMATCH,
        { ...valid, uid: other.uid, runtimeScopeId: other.runtimeScopeId, sandboxId: other.sandboxId },
      ],
      [ErrorCode.RELEASE_SANDBOX_MISMATCH, { ...valid, sandboxId: other.sandboxId }],
      [ErrorCode.RELEASE_SANDBOX_MISMATCH, { ...valid, generation: valid.generation + 1 }],
      [ErrorCode.RELEASE_RUN_NOT_ROOT, { ...valid, runId: child }],
      [ErrorCode.RELEASE_RUN_NOT_TERMINAL, stillRunningCommand],
    ];
    const handler = createReleaseHandler({
      db: fixture.t.db,
      queues: sqsFixture.queues,
      telemetry: createTelemetry({ functionName: 'release', logLevel: 'INFO' }),
      config,
      provider: createProvider(config, fixture.provisioner.url),
    });
    const auditBefore = fixture.provisioner.audit().length;

    let failures: unknown;
    const lines = await captureStdout(async () => {
      const response = await handler(
        {
          Records: forged.map(([, command], index) =>
            sqsRecord(JSON.stringify(command), {
              queue: QueueName.RUNTIME_RELEASE,
              attributes: { MessageGroupId: `forged-${index}` },
            }),
          ),
        },
        context,
      );
      failures = response.batchItemFailures;
    });

    // Nothing comes back for a retry: each was dead-lettered at once.
    expect(failures).toEqual([]);
    const letters = await drain(deadLetterQueueName(QueueName.RUNTIME_RELEASE));
    expect(letters.map((letter) => letter.errorCode).sort()).toEqual(forged.map(([code]) => code).sort());
    // Not one request reached the provisioner; every sandbox is alive.
    expect(fixture.provisioner.audit().slice(auditBefore)).toEqual([]);
    for (const run of [mine, other, stillRunning]) {
      expect(fixture.provisioner.sandbox(run.sandboxId)?.alive).toBe(true);
    }
    // Counted by reason, and logged with it.
    const deadLettered = emfMetrics(lines).filter((metric) => metric.name === MetricName.DEAD_LETTERED);
    for (const code of new Set(forged.map(([c]) => c))) {
      expect(deadLettered.filter((metric) => metric.dimensions.reason === code).length).toBe(
        forged.filter(([c]) => c === code).length,
      );
    }
    expect(lines.filter((line) => line.message === 'release refused before any DELETE')).toHaveLength(
      forged.length,
    );
    // A sandbox mismatch also sends the run back to phase 1, which resolves what the database
    // records: a counted restart, after its backoff delay (1 s here).
    const announced: Array<{ runId: string; restarts?: number }> = [];
    await eventually('both restarts to arrive', async () => {
      announced.push(
        ...(await drain(QueueName.RUN_FINISHED)).map((m) => JSON.parse(m.body) as { runId: string }),
      );
      return announced.length >= 2;
    });
    expect(announced.map((m) => m.runId)).toEqual([valid.runId, valid.runId]);
    expect(announced.map((m) => m.restarts)).toEqual([1, 1]);

    // The genuine commands still go through afterwards.
    let genuineFailures: unknown;
    await captureStdout(async () => {
      const response = await handler(
        {
          Records: [valid, otherValid].map((command, index) =>
            sqsRecord(JSON.stringify(command), {
              queue: QueueName.RUNTIME_RELEASE,
              attributes: { MessageGroupId: `genuine-${index}` },
            }),
          ),
        },
        context,
      );
      genuineFailures = response.batchItemFailures;
    });
    expect(genuineFailures).toEqual([]);
    expect(fixture.provisioner.sandbox(mine.sandboxId)).toBeUndefined();
    expect(fixture.provisioner.sandbox(other.sandboxId)).toBeUndefined();
  });
});
