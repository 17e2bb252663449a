/**
 * Release goes through the one delete path (guarded-delete.ts) and keeps its rule that a DELETE
 * whose delete-in-flight record could end before the DELETE stops acting is never sent: a worker
 * frozen between the guard and the DELETE (a Lambda environment frozen with the promise pending,
 * thawed at a later invocation) stands in as the process clock jumping forward while the guard
 * answers. Real PostgreSQL and the real local provisioner.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { deleteMayStillAct } from '../../functions/cleanup/errors.ts';
import type { TransactOptions } from '../../functions/cleanup/executor.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { DELETE_IN_FLIGHT_MARGIN_SECONDS } from '../../functions/cleanup/guarded-delete.ts';
import { processReleaseCommand } from '../../functions/cleanup/release-command.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { provisionedRootRun, releaseNeeded } from '../support/probes.ts';

const fixture = useDatabaseFixture();
const LOCK_TIMEOUT_MS = 2_000;

let rootDir: string;
let provisioner: LocalProvisioner;
let client: ProvisionerClient;
let provider: SandboxProvider;
beforeAll(async () => {
  rootDir = await mkdtemp(join(tmpdir(), 'release-too-late-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 200 });
  client = new ProvisionerClient(provisioner.url);
  provider = new SandboxProvider({ client, releaseLockTimeoutMs: 1_000, provisionerDeleteTimeoutMs: 1_000 });
});
afterAll(async () => {
  await client?.close();
  await provisioner?.stop();
  await rm(rootDir, { recursive: true, force: true });
});

async function releaseWithClock(frozenForMs: number) {
  const run = await provisionedRootRun(fixture.t.db, provisioner);
  const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
  let offsetMs = 0;
  const db = {
    query: fixture.t.db.query.bind(fixture.t.db),
    transact: async (text: string, values?: readonly unknown[], options?: TransactOptions) => {
      const answer = await fixture.t.db.transact(text, values, options);
      if (text.includes('runtime_cleanup_begin_release')) offsetMs = frozenForMs;
      return answer;
    },
  };
  const decision = await processReleaseCommand(
    { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
    {
      db: db as never,
      provider,
      boundMs: 3_000,
      provisionerDeleteTimeoutSeconds: 1,
      databaseLockTimeoutMs: LOCK_TIMEOUT_MS,
      retryPolicy: { baseSeconds: 1, maxSeconds: 2 },
      now: () => Date.now() + offsetMs,
    },
  );
  return { run, decision };
}

it('a guard answered later than its slack (lock wait + margin): no DELETE, the record lowered, retried', async () => {
  const { run, decision } = await releaseWithClock(
    LOCK_TIMEOUT_MS + (DELETE_IN_FLIGHT_MARGIN_SECONDS + 1) * 1000,
  );
  expect(decision.action).toBe('failed');
  const error = decision.action === 'failed' ? decision.error : undefined;
  expect(error).toMatchObject({ code: 'CLEANUP_TIMEOUT', retryable: true });
  expect(deleteMayStillAct(error)).toBe(false);
  expect(
    provisioner.audit().filter((entry) => entry.method === 'DELETE' && entry.sandboxId === run.sandboxId),
  ).toEqual([]);
  expect(provisioner.sandbox(run.sandboxId)).toBeDefined();
  // Nothing was sent, so nothing can act: the scope is not held closed by this attempt.
  const { rows } = await fixture.t.db.query<{ in_flight: boolean }>(
    'SELECT delete_in_flight_until IS NOT NULL AS in_flight FROM sandbox_runtimes WHERE uid = $1 AND runtime_scope_id = $2',
    [run.uid, run.runtimeScopeId],
  );
  expect(rows[0]!.in_flight).toBe(false);
});

it('a guard answered within its slack: the DELETE goes out and is confirmed', async () => {
  const { run, decision } = await releaseWithClock(LOCK_TIMEOUT_MS);
  expect(decision).toMatchObject({ action: 'finalize', outcome: 'deleted' });
  expect(provisioner.sandbox(run.sandboxId)).toBeUndefined();
});
