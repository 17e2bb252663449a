import { beforeAll, describe, expect, inject, it } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { DeferralReason, FenceCheckOutcome, FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { fenceOf, finishedRootRun, insertOtherRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { holdScopeAdvisoryLock, rejectionOf, releaseNeeded } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

/**
 * Review finding F19: the decisions rely on READ COMMITTED. Each one takes the scope's advisory
 * lock and then re-reads what the lock's previous holder committed; under REPEATABLE READ the
 * re-read would see the snapshot taken before the lock was granted. A platform database (or role)
 * configured with `default_transaction_isolation = 'repeatable read'` must not change what the
 * cleanup decides: every protocol transaction begins READ COMMITTED explicitly, and the decision
 * functions refuse any other level with a clear error.
 *
 * The file's database is switched before anything connects to it, so every session it gets (also
 * behind PgBouncer, whose server connections are opened after the switch) starts REPEATABLE READ.
 */
const fixture = useDatabaseFixture();
let other: Database;

beforeAll(async () => {
  const { adminUrl, driver, wsProxy } = inject('database');
  const admin = await openDatabase({
    url: adminUrl,
    driver,
    wsProxy,
    lockTimeoutMs: 5_000,
    statementTimeoutMs: 30_000,
  });
  try {
    // The name is made of hex digits by createTestDatabase.
    await admin.query(
      `ALTER DATABASE ${fixture.t.name} SET default_transaction_isolation = 'repeatable read'`,
    );
  } finally {
    await admin.end();
  }
  other = await fixture.t.connect();
});

const OPTIONS = { inFlightSeconds: 60, lockTimeoutMs: 5_000 };

describe('a database whose default isolation is REPEATABLE READ', () => {
  it('really starts its sessions REPEATABLE READ (the premise of this file)', async () => {
    const { rows } = await fixture.t.db.query<{ level: string }>(
      "SELECT current_setting('transaction_isolation') AS level",
    );
    expect(rows[0]!.level).toBe('repeatable read');
  });

  it('runs every protocol transaction READ COMMITTED', async () => {
    const level = await fixture.t.db.withTransaction(async (tx) => {
      const { rows } = await tx.query<{ level: string }>(
        "SELECT current_setting('transaction_isolation') AS level",
      );
      return rows[0]!.level;
    });
    expect(level).toBe('read committed');
    const { rows } = await fixture.t.db.transact<{ level: string }>(
      "SELECT current_setting('transaction_isolation') AS level",
    );
    expect(rows[0]!.level).toBe('read committed');
  });

  it('runs a whole cleanup: fence check, release guard, finalize', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const guard = await beginRelease(
      fixture.t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      OPTIONS,
    );
    expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
    if (guard.verdict !== ReleaseGuard.PROCEED) return;
    await endRelease(fixture.t.db, guard.inFlight);
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
  });

  it('decides on what the previous holder of the scope lock committed, not on an older snapshot', async () => {
    const s = await finishedRootRun(fixture.t.db);
    // The platform holds the scope's lock to admit a new run; phase 1 queues behind it.
    const admission = await holdScopeAdvisoryLock(other, s);
    const checking = fenceCheck(fixture.t.db, s.rootRunId);
    await eventually('phase 1 waits for the scope lock', async () => {
      const { rows } = await other.query<{ waiting: number }>(
        `SELECT count(*)::int AS waiting FROM pg_locks
         WHERE locktype = 'advisory' AND NOT granted
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      );
      return rows[0]!.waiting > 0;
    });
    const admitted = await insertOtherRun(other, s, { status: 'running' });
    await admission.release();
    // Under a snapshot taken before the lock, the admitted run would be invisible: RELEASE_NEEDED.
    expect(await checking).toMatchObject({
      outcome: FenceCheckOutcome.DEFERRED,
      reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
      blockingRunId: admitted,
    });
  });
});

describe('the decision functions refuse any isolation but READ COMMITTED', () => {
  it.each([
    ['runtime_cleanup_fence_check', "SELECT * FROM runtime_cleanup_fence_check('any-run')"],
    [
      'runtime_cleanup_finalize',
      "SELECT * FROM runtime_cleanup_finalize('any-run', 'u', 's', 'w', NULL, NULL, NULL)",
    ],
    [
      'runtime_cleanup_begin_release',
      "SELECT * FROM runtime_cleanup_begin_release('any-run', 'u', 's', 'sbx', 1, NULL, 60, 'token', 1000)",
    ],
    [
      'runtime_cleanup_force_clear',
      "SELECT * FROM runtime_cleanup_force_clear('any-run', 'why', 'who', false)",
    ],
    [
      'runtime_cleanup_begin_reclaim',
      "SELECT * FROM runtime_cleanup_begin_reclaim('sbx-any', 1, true, 60, 60, 'token', 1000)",
    ],
  ])('%s, called in a REPEATABLE READ transaction, raises 25000 with the reason', async (_, call) => {
    // An autocommit statement runs at the database's default level, REPEATABLE READ here.
    const error = await rejectionOf(fixture.t.db.query(call));
    expect(error).toMatchObject({
      code: '25000',
      message: expect.stringContaining(
        'runtime cleanup decisions need READ COMMITTED; this transaction is REPEATABLE READ',
      ),
    });
  });
});
