import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
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

/**
 * The client retries a DELETE once after a connection reset (a stale kept-alive socket). A reset
 * can also come AFTER the request was written: the provisioner may then be carrying that first
 * DELETE out while the retry is answered (404: already gone). The release must not treat the
 * retry's answer as the end of everything it sent: the scope's delete-in-flight record keeps the
 * residual window (the provisioner's delete time plus the margin), as for any unanswered request.
 */
const fixture = useDatabaseFixture();
const sqsFixture = useSqsFixture();
const config = loadConfig({
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '1',
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '5',
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '8',
  CLEANUP_RETRY_BASE_SECONDS: '1',
  CLEANUP_RETRY_MAX_SECONDS: '2',
});
const RESIDUAL_SECONDS = config.provisionerDeleteTimeoutSeconds + DELETE_IN_FLIGHT_MARGIN_SECONDS;
const context = { getRemainingTimeInMillis: () => 60_000 } as Context;

let rootDir: string;
let provisioner: LocalProvisioner;
/** Resets the first request's connection after reading it, then refuses every request with 403. */
let resetThenRefuse: Server;
/** Answers every DELETE with 202: accepted, still deleting. */
let accepting: Server;
let acceptingUrl: string;
let resetThenRefuseUrl: string;
const refusedRequests: string[] = [];
beforeAll(async () => {
  rootDir = await mkdtemp(join(tmpdir(), 'release-unanswered-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 200 });
  resetThenRefuse = createServer((request, response) => {
    refusedRequests.push(`${request.method} ${request.url}`);
    if (refusedRequests.length === 1) {
      request.socket.resetAndDestroy();
      return;
    }
    response.writeHead(403, { 'content-type': 'application/json' }).end('{"error":"forbidden"}');
  });
  await new Promise<void>((resolve) => resetThenRefuse.listen(0, '127.0.0.1', resolve));
  resetThenRefuseUrl = `http://127.0.0.1:${(resetThenRefuse.address() as AddressInfo).port}`;
  accepting = createServer((_request, response) => {
    response.writeHead(202, { 'content-type': 'application/json' }).end('{"status":"deleting"}');
  });
  await new Promise<void>((resolve) => accepting.listen(0, '127.0.0.1', resolve));
  acceptingUrl = `http://127.0.0.1:${(accepting.address() as AddressInfo).port}`;
});
afterAll(async () => {
  resetThenRefuse?.closeAllConnections();
  await new Promise((resolve) => resetThenRefuse?.close(resolve));
  accepting?.closeAllConnections();
  await new Promise((resolve) => accepting?.close(resolve));
  await provisioner?.stop();
  await rm(rootDir, { recursive: true, force: true });
});

async function deliver(command: ReleaseCommand, url: string) {
  const handler = createReleaseHandler({
    db: fixture.t.db,
    queues: sqsFixture.queues,
    telemetry: createTelemetry({ functionName: 'release', logLevel: 'SILENT' }),
    config,
    provider: createProvider(config, url),
  });
  return handler(
    {
      Records: [
        sqsRecord(JSON.stringify(command), {
          queue: QueueName.RUNTIME_RELEASE,
          attributes: {
            MessageGroupId: `${command.uid}:${command.runtimeScopeId}`,
            ApproximateReceiveCount: '1',
          },
        }),
      ],
    },
    context,
  );
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

/** The record's deadline, in seconds from now on the database clock (null: no record). */
async function recordSecondsLeft(run: ProvisionedRun): Promise<number | null> {
  const { rows } = await fixture.t.db.query<{ left: number | null }>(
    `SELECT extract(epoch FROM delete_in_flight_until - clock_timestamp())::float8 AS left
     FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [run.uid, run.runtimeScopeId],
  );
  return rows[0]!.left;
}

describe('a release whose first DELETE was reset after it was written', () => {
  it('keeps the residual window when the retry is answered 404', async () => {
    const run = await provisionedRootRun(fixture.t.db, provisioner);
    // The provisioner deletes the sandbox for real, then loses the answer; the retry finds it gone.
    provisioner.setFault(run.sandboxId, { reset: true, afterHandling: true, times: 1 });

    expect((await deliver(await commandFor(run), provisioner.url)).batchItemFailures).toEqual([]);

    const deletes = provisioner.audit().filter(isDeleteOf(run.sandboxId));
    expect(deletes.map((entry) => entry.outcome)).toEqual(['reset', expect.anything()]);
    expect(deletes[1]!.status).toBe(404);
    const left = await recordSecondsLeft(run);
    expect(left).not.toBeNull();
    expect(left!).toBeGreaterThan(RESIDUAL_SECONDS - 3);
    expect(left!).toBeLessThanOrEqual(RESIDUAL_SECONDS);
  });

  it('keeps the residual window when the retry is refused (a settled answer on its own)', async () => {
    const run = await provisionedRootRun(fixture.t.db, provisioner);

    // 403 is dead-lettered (non-retryable): no batch item failure, and nothing was deleted here.
    expect((await deliver(await commandFor(run), resetThenRefuseUrl)).batchItemFailures).toEqual([]);

    expect(refusedRequests).toHaveLength(2);
    const left = await recordSecondsLeft(run);
    expect(left).not.toBeNull();
    expect(left!).toBeGreaterThan(RESIDUAL_SECONDS - 3);
  });
});

describe('a release answered 202 (accepted, not done yet)', () => {
  it('is retried, and keeps the residual window: the provisioner is still deleting', async () => {
    const run = await provisionedRootRun(fixture.t.db, provisioner);

    expect((await deliver(await commandFor(run), acceptingUrl)).batchItemFailures).toHaveLength(1);

    const left = await recordSecondsLeft(run);
    expect(left).not.toBeNull();
    expect(left!).toBeGreaterThan(RESIDUAL_SECONDS - 3);
  });
});
