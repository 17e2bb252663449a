import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Context } from 'aws-lambda';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import type { ReleaseCommand } from '../../functions/adapters/messages.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { DELETE_IN_FLIGHT_MARGIN_SECONDS } from '../../functions/cleanup/guarded-delete.ts';
import { createProvider, createReleaseHandler } from '../../functions/release/handler.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { useDatabaseFixture, useSqsFixture } from '../support/fixtures.ts';
import { isDeleteOf, type ProvisionedRun, provisionedRootRun, releaseNeeded } from '../support/probes.ts';
import { sqsRecord } from '../support/sqs-record.ts';
import { eventually } from '../support/stack.ts';

/**
 * The delete-in-flight record after each kind of ending, through the real release handler: it
 * ends when the provisioner answered (nothing of that attempt can act any more), and it outlives
 * an attempt that ended without an answer by the provisioner's own delete time plus a margin,
 * because the provisioner may still carry out a request we stopped waiting for. That is the window
 * in which force-clear refuses and admission stays closed.
 */
const fixture = useDatabaseFixture();
const sqsFixture = useSqsFixture();
/** Small bounds so the windows are seconds: lock 1 s + delete 1 s < whole release 3 s. */
const config = loadConfig({
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '1',
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '1',
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '3',
  CLEANUP_RETRY_BASE_SECONDS: '1',
  CLEANUP_RETRY_MAX_SECONDS: '2',
});
const RESIDUAL_SECONDS = config.provisionerDeleteTimeoutSeconds + DELETE_IN_FLIGHT_MARGIN_SECONDS;
const context = { getRemainingTimeInMillis: () => 60_000 } as Context;

let rootDir: string;
let provisioner: LocalProvisioner;
/** Its sandboxes ignore SIGTERM, so a delete takes the grace period: it outlives a client that gave up. */
let slowToDelete: LocalProvisioner;
beforeAll(async () => {
  rootDir = await mkdtemp(join(tmpdir(), 'release-in-flight-'));
  provisioner = await startProvisioner({ rootDir: join(rootDir, 'normal'), graceMs: 200 });
  slowToDelete = await startProvisioner({
    rootDir: join(rootDir, 'stubborn'),
    graceMs: 2_500,
    sandboxIgnoresSigterm: true,
  });
});
afterAll(async () => {
  await Promise.all([provisioner?.stop(), slowToDelete?.stop()]);
  await rm(rootDir, { recursive: true, force: true });
});

function handler(target = provisioner) {
  return createReleaseHandler({
    db: fixture.t.db,
    queues: sqsFixture.queues,
    telemetry: createTelemetry({ functionName: 'release', logLevel: 'SILENT' }),
    config,
    provider: createProvider(config, target.url),
  });
}

async function commandFor(run: ProvisionedRun): Promise<ReleaseCommand> {
  const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
  return {
    ...identity,
    sandboxId: identity.sandboxId!,
    generation: identity.generation!,
    requestedAt: new Date().toISOString(),
  };
}

async function deliver(command: ReleaseCommand, receiveCount = 1, target = provisioner) {
  return handler(target)(
    {
      Records: [
        sqsRecord(JSON.stringify(command), {
          queue: QueueName.RUNTIME_RELEASE,
          attributes: {
            MessageGroupId: `${command.uid}:${command.runtimeScopeId}`,
            ApproximateReceiveCount: String(receiveCount),
          },
        }),
      ],
    },
    context,
  );
}

/** The record's deadline, in seconds from now on the database clock (null: no record). */
async function recordSecondsLeft(run: ProvisionedRun): Promise<number | null> {
  const { rows } = await fixture.t.db.query<{ left: number | null }>(
    `SELECT extract(epoch FROM delete_in_flight_until - clock_timestamp())::float8 AS left
     FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [run.uid, run.runtimeScopeId],
  );
  return rows[0]!.left;
}

describe('the delete-in-flight record after a release attempt', () => {
  it('ends at once when the provisioner answered, success or refusal', async () => {
    const deleted = await provisionedRootRun(fixture.t.db, provisioner);
    expect((await deliver(await commandFor(deleted))).batchItemFailures).toEqual([]);
    expect(await recordSecondsLeft(deleted)).toBeNull();

    const anomaly = await provisionedRootRun(fixture.t.db, provisioner);
    provisioner.setFault(anomaly.sandboxId, { conflictGeneration: 0, times: 1 });
    // GENERATION_ANOMALY: dead-lettered, and the provisioner decided: nothing of it can act.
    expect((await deliver(await commandFor(anomaly))).batchItemFailures).toEqual([]);
    expect(await recordSecondsLeft(anomaly)).toBeNull();
  });

  it('outlives a 5xx by the provisioner’s delete time plus the margin, and stays as the floor of the next attempt', async () => {
    const run = await provisionedRootRun(fixture.t.db, provisioner);
    const command = await commandFor(run);
    provisioner.setFault(run.sandboxId, { status: 504, times: 1 });

    expect((await deliver(command)).batchItemFailures).toHaveLength(1);
    const afterFailure = (await recordSecondsLeft(run))!;
    expect(afterFailure).toBeGreaterThan(RESIDUAL_SECONDS - 2);
    expect(afterFailure).toBeLessThanOrEqual(RESIDUAL_SECONDS);

    // The retry deletes; its own record ends, the earlier attempt's window does not.
    expect((await deliver(command, 2)).batchItemFailures).toEqual([]);
    expect(provisioner.sandbox(run.sandboxId)).toBeUndefined();
    const afterSuccess = (await recordSecondsLeft(run))!;
    expect(afterSuccess).toBeGreaterThan(afterFailure - 3);
    expect(afterSuccess).toBeLessThanOrEqual(afterFailure);
  });

  it('covers a delete the provisioner carries out after the release gave up on it', async () => {
    const run = await provisionedRootRun(fixture.t.db, slowToDelete);
    const command = await commandFor(run);
    // Until its trap ignores SIGTERM (it then writes `ready`), SIGTERM would kill it outright.
    await eventually('the sandbox ignoring SIGTERM', async () => existsSync(join(run.dir, 'ready')));

    // The sandbox ignores SIGTERM: the delete takes 2.5 s at the provisioner; the client waits 1 s.
    const response = await deliver(command, 1, slowToDelete);
    expect(response.batchItemFailures).toHaveLength(1);
    expect(await recordSecondsLeft(run)).not.toBeNull();

    // The provisioner finishes the delete on its own, later: the record must still be live then.
    const { rows } = await fixture.t.db.query<{ until: Date }>(
      `SELECT delete_in_flight_until AS until FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [run.uid, run.runtimeScopeId],
    );
    // The audit records what the request really deleted, even though nobody heard the answer.
    const entry = await eventually('the provisioner finished the abandoned delete', async () =>
      slowToDelete.audit().find((e) => isDeleteOf(run.sandboxId)(e) && e.deletedGeneration !== undefined),
    );
    expect(entry.outcome).toBe('aborted');
    const { rows: now } = await fixture.t.db.query<{ now: Date }>('SELECT clock_timestamp() AS now');
    expect(entry.deletedGeneration).toBe(run.generation);
    expect(rows[0]!.until.getTime()).toBeGreaterThan(now[0]!.now.getTime());
  });
});
