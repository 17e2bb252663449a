/**
 * ADR acceptance row 1: no AgentRun row lock and no runtime advisory transaction lock is held
 * while the sandbox delete waits. Evidence on real PostgreSQL: while the provisioner holds the
 * DELETE (a `hang` fault, so the wait is as long as the test wants), another connection takes the
 * run's row with NOWAIT and the scope's advisory lock with a try-lock. The negative controls hold
 * phase 1 and phase 3 open on purpose and show the very same probes fail then, so a passing probe
 * means "free", not "the probe cannot see the lock".
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { release } from '../../functions/cleanup/release.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { FinalizeOutcome, ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { fenceOf } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import {
  databaseActivity,
  isDeleteOf,
  pathExists,
  pausingDatabase,
  probeCleanupLocks,
  provisionedRootRun,
  releaseNeeded,
  type TestProvider,
} from '../support/probes.ts';

const fixture = useProvisionerFixture({ tempPrefix: 'rc-lock-freedom-' });
let other: Database;
let sandboxes: TestProvider;

beforeAll(async () => {
  other = await fixture.t.connect({ maxConnections: 2 });
  sandboxes = fixture.testProvider();
});

describe('ADR row 1: no database lock is held while the sandbox delete waits', () => {
  it('lets another connection lock the run row (NOWAIT) and the scope advisory lock while the DELETE hangs', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    fixture.provisioner.setFault(run.sandboxId, { hang: true });

    const releasing = release(identity, { provider: sandboxes.provider, runtimeCleanupTimeoutMs: 20_000 });
    await fixture.provisioner.waitForRequest(isDeleteOf(run.sandboxId), 5_000);

    expect(await probeCleanupLocks(other, run)).toEqual({ rowLock: 'free', scopeLock: 'free' });
    // Stronger than the two probes: nothing in this database holds an advisory lock or sits in an
    // open transaction while the external call waits.
    expect(await databaseActivity(other)).toEqual({ advisoryLocks: 0, openTransactions: 0 });
    // The durable fence, not a lock, is what covers the wait.
    expect(await fenceOf(other, run.rootRunId)).toBe(true);

    fixture.provisioner.clearFaults(run.sandboxId);
    expect((await releasing).outcome).toBe(ReleaseOutcome.DELETED);
  });

  it('holds no lock after the release guard either: its lock ended with its statement, its record is a row', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const guard = await beginRelease(
      fixture.t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      { inFlightSeconds: 60, lockTimeoutMs: 2_000 },
    );
    if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(guard.verdict);
    fixture.provisioner.setFault(run.sandboxId, { hang: true });

    const releasing = release(identity, { provider: sandboxes.provider, runtimeCleanupTimeoutMs: 20_000 });
    await fixture.provisioner.waitForRequest(isDeleteOf(run.sandboxId), 5_000);

    expect(await probeCleanupLocks(other, run)).toEqual({ rowLock: 'free', scopeLock: 'free' });
    expect(await databaseActivity(other)).toEqual({ advisoryLocks: 0, openTransactions: 0 });
    // The sandbox row is not locked either: a platform can record a generation meanwhile.
    const rowFree = await other.withTransaction(async (tx) => {
      const { rowCount } = await tx.query(
        'SELECT 1 FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text FOR UPDATE NOWAIT',
        [run.uid, run.runtimeScopeId],
      );
      return rowCount === 1;
    });
    expect(rowFree).toBe(true);

    fixture.provisioner.clearFaults(run.sandboxId);
    expect((await releasing).outcome).toBe(ReleaseOutcome.DELETED);
    expect(await endRelease(fixture.t.db, guard.inFlight)).toBeNull();
  });

  it('runs fence check → release → finalize end to end: the sandbox process and directory are gone and the fence is clear', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(true);
    expect(await pathExists(run.dir)).toBe(true);

    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const released = await release(identity, {
      provider: sandboxes.provider,
      runtimeCleanupTimeoutMs: 20_000,
    });
    expect(released.outcome).toBe(ReleaseOutcome.DELETED);
    const finalized = await finalize(fixture.t.db, identity);

    expect(finalized.outcome).toBe(FinalizeOutcome.CLEARED);
    expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(false);
    expect(fixture.provisioner.sandbox(run.sandboxId)).toBeUndefined();
    expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(false);
    expect(await pathExists(run.dir)).toBe(false);
    const { rows } = await fixture.t.db.query<{ released: boolean }>(
      'SELECT released_at IS NOT NULL AS released FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [run.uid, run.runtimeScopeId],
    );
    expect(rows[0]?.released).toBe(true);
  });
});

describe('negative controls: the same probes fail while a phase transaction is open', () => {
  it('sees the row lock (55P03) and the scope lock held while phase 1 (fence check) is uncommitted, and free after its commit', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const paused = pausingDatabase(fixture.t.db);
    const checking = fenceCheck(paused, run.rootRunId);
    try {
      await paused.paused;
      expect(await probeCleanupLocks(other, run)).toEqual({ rowLock: 'held', scopeLock: 'held' });
    } finally {
      // A failed assertion must not leave the transaction (and the file's teardown) waiting forever.
      paused.resume();
    }
    releaseNeeded(await checking);
    expect(await probeCleanupLocks(other, run)).toEqual({ rowLock: 'free', scopeLock: 'free' });
  });

  it('sees the row lock (55P03) and the scope lock held while phase 3 (finalize) is uncommitted, and free after its commit', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    await release(identity, { provider: sandboxes.provider, runtimeCleanupTimeoutMs: 20_000 });

    const paused = pausingDatabase(fixture.t.db);
    const finalizing = finalize(paused, identity);
    try {
      await paused.paused;
      expect(await probeCleanupLocks(other, run)).toEqual({ rowLock: 'held', scopeLock: 'held' });
      // Uncommitted, the cleared fence is invisible to everyone else: the scope stays blocked.
      expect(await fenceOf(other, run.rootRunId)).toBe(true);
    } finally {
      paused.resume();
    }
    expect((await finalizing).outcome).toBe(FinalizeOutcome.CLEARED);
    expect(await probeCleanupLocks(other, run)).toEqual({ rowLock: 'free', scopeLock: 'free' });
  });
});
