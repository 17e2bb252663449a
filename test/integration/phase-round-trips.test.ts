import { beforeAll, describe, expect, inject, it } from 'vitest';
import { floorCheck, floorClear } from '../../bench/support/floor-transactions.ts';
import { installLockTakenNote } from '../../bench/support/instrumented-functions.ts';
import {
  observedTransact,
  observeTransactions,
  type RoundTripTiming,
} from '../../bench/support/observed-transactions.ts';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { DATABASE_DRIVERS } from '../../functions/adapters/database-driver.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { finishedRootRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';

/**
 * Issue 15: phase 1, the release guard and phase 3 each hold the scope's advisory lock and the
 * run's row lock for ONE round trip: BEGIN, the bounds, the decision function and COMMIT go in a
 * single message, so the locks are taken and released while the server handles it. Counted in the
 * adapter (every message sent to the server), not estimated.
 */
const fixture = useDatabaseFixture();

/** A database on the server itself, not through PgBouncer when the suite runs behind one. */
function directUrl(name: string): string {
  const url = new URL(inject('database').adminUrl);
  url.pathname = `/${name}`;
  return url.toString();
}

async function roundTrips<T>(
  db: Database,
  work: () => Promise<T>,
): Promise<{ result: T; trips: number; transactions: number }> {
  const before = { ...db.stats };
  const result = await work();
  return {
    result,
    trips: db.stats.queries - before.queries,
    transactions: db.stats.transactions - before.transactions,
  };
}

describe.each(DATABASE_DRIVERS)(
  'over the %s driver: one round trip per decision, locks included',
  (driver) => {
    it('phase 1, the release guard and phase 3: one message each, one transaction each', async () => {
      const db = await fixture.t.connect({ maxConnections: 1, driver });
      const s = await finishedRootRun(fixture.t.db);

      const checked = await roundTrips(db, () => fenceCheck(db, s.rootRunId));
      expect({ trips: checked.trips, transactions: checked.transactions }).toEqual({
        trips: 1,
        transactions: 1,
      });
      const identity = releaseNeeded(checked.result);

      const target = { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! };
      const guarded = await roundTrips(db, () =>
        beginRelease(db, target, { inFlightSeconds: 60, lockTimeoutMs: 5_000 }),
      );
      expect({ trips: guarded.trips, transactions: guarded.transactions }).toEqual({
        trips: 1,
        transactions: 1,
      });
      if (guarded.result.verdict !== ReleaseGuard.PROCEED) throw new Error(guarded.result.verdict);
      await endRelease(db, guarded.result.inFlight);

      const finalized = await roundTrips(db, () => finalize(db, identity));
      expect(finalized.result.outcome).toBe(FinalizeOutcome.CLEARED);
      expect({ trips: finalized.trips, transactions: finalized.transactions }).toEqual({
        trips: 1,
        transactions: 1,
      });
    });

    it('leaves no lock and no open transaction behind once the one message is answered', async () => {
      const db = await fixture.t.connect({ maxConnections: 1, driver });
      const s = await finishedRootRun(fixture.t.db);
      releaseNeeded(await fenceCheck(db, s.rootRunId));
      // Same connection (pool of one), next message: had the transaction stayed open, this would be
      // inside it, holding the scope's advisory lock.
      // now() is the transaction's start: equal to the statement's own start only outside an older one.
      const { rows } = await db.query<{ advisory: number; fresh: boolean }>(
        `SELECT (SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS advisory,
              now() = statement_timestamp() AS fresh`,
      );
      expect(rows[0]).toEqual({ advisory: 0, fresh: true });
    });

    it('a product database notes no lock-taken moment: an observed decision reports no server-side hold', async () => {
      // The benchmark's clock (bench/support/instrumented-functions.ts) is not in the product's
      // functions: one body per function, without a benchmark hook.
      const db = await fixture.t.connect({ maxConnections: 1, driver });
      const s = await finishedRootRun(fixture.t.db);
      const observed: RoundTripTiming[] = [];
      const observedDb = observeTransactions(db, (timing) => observed.push(timing));
      const trip = await roundTrips(db, () =>
        observedDb.transact<{ decision: string }>(
          'SELECT decision FROM runtime_cleanup_fence_check($1::text)',
          [s.rootRunId],
        ),
      );
      expect(trip.result.rows[0]?.decision).toBe('release_needed');
      // Observed, the message is still one, and still one transaction.
      expect([trip.trips, trip.transactions]).toEqual([1, 1]);
      expect(observed).toHaveLength(1);
      expect(observed[0]!.lockHeldMs).toBeNull();
      const { rows: noted } = await fixture.t.db.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_proc WHERE proname = 'runtime_cleanup_note_lock_taken'`,
      );
      expect(noted[0]!.n).toBe(0);
    });
  },
);

/**
 * The benchmark's server-side lock-hold clock: its instrumented copies of the decision functions,
 * generated from infra/sql/ and installed into this describe's own database only, note when each
 * took the scope's lock; an observed message (bench/support/observed-transactions.ts) reads it.
 */
describe('the benchmark’s lock-hold clock, on a database with its instrumented copies', () => {
  const bench = useDatabaseFixture();
  beforeAll(async () => {
    expect(await installLockTakenNote(bench.t.db)).toEqual(
      expect.arrayContaining([
        'runtime_cleanup_lock_run',
        'runtime_cleanup_finalize',
        'runtime_cleanup_begin_release',
      ]),
    );
  });
  it('the benchmark’s floor: one message each, its lock hold noted as the decisions’ is, the fence cleared', async () => {
    // The yardstick of issue 15's lock hold (bench/locks, bench/e2e): if its hold were not noted,
    // the report would show no floor, and if it took more trips, it would not be a floor.
    const db = await bench.t.connect({ maxConnections: 1 });
    const s = await finishedRootRun(bench.t.db);
    const timings: RoundTripTiming[] = [];
    const observed = observeTransactions(db, (t) => timings.push(t));
    const checked = await roundTrips(db, () => floorCheck(observed, s.rootRunId));
    expect(checked.result).toMatchObject({
      runId: s.rootRunId,
      uid: s.uid,
      runtimeScopeId: s.runtimeScopeId,
    });
    const cleared = await roundTrips(db, () => floorClear(observed, checked.result));
    for (const trip of [checked, cleared]) expect([trip.trips, trip.transactions]).toEqual([1, 1]);
    expect(timings).toHaveLength(2);
    for (const timing of timings) {
      expect(timing.lockHeldMs).not.toBeNull();
      expect(timing.lockHeldMs!).toBeGreaterThanOrEqual(0);
      expect(timing.lockHeldMs!).toBeLessThanOrEqual(timing.serverMs);
    }
    const { rows } = await bench.t.db.query<{ pending: boolean; released: boolean }>(
      `SELECT r.runtime_cleanup_pending AS pending, s.released_at IS NOT NULL AS released
       FROM agent_runs r JOIN sandbox_runtimes s USING (uid, runtime_scope_id) WHERE r.id = $1`,
      [s.rootRunId],
    );
    expect(rows).toEqual([{ pending: false, released: true }]);
    await expect(floorCheck(db, 'run-that-does-not-exist')).rejects.toThrow('has no sandbox');
  });

  it('an observed decision reports its lock hold and the server time, within its round trip, in one trip', async () => {
    const db = await bench.t.connect({ maxConnections: 1 });
    const observed: RoundTripTiming[] = [];
    const transact = observedTransact(db, (timing) => observed.push(timing));
    const s = await finishedRootRun(bench.t.db);
    const key = [s.uid, s.runtimeScopeId];

    // Another connection holds the scope's lock for 300 ms: the decision waits most of that for it.
    // The wait is in the server's time on the message but not in the hold, which starts when the
    // decision took the lock.
    const other = await bench.t.connect({ maxConnections: 1 });
    // Both connected first: a pool connects on its first query, and a connect inside the 300 ms
    // (a SCRAM handshake against embedded PostgreSQL: 130 ms alone, more on a busy machine) would
    // eat into the wait this test measures.
    await Promise.all([db.query('SELECT 1'), other.query('SELECT 1')]);
    let locked: () => void = () => {};
    const lockTaken = new Promise<void>((resolve) => (locked = resolve));
    const holding = other.withTransaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', key);
      locked();
      await tx.query('SELECT pg_sleep(0.3)');
    });
    await lockTaken;
    const trip = await roundTrips(db, () =>
      transact<{ decision: string }>('SELECT decision FROM runtime_cleanup_fence_check($1::text)', [
        s.rootRunId,
      ]),
    );
    await holding;
    expect(trip.result.rows[0]?.decision).toBe('release_needed');
    expect({ trips: trip.trips, transactions: trip.transactions }).toEqual({ trips: 1, transactions: 1 });

    // A statement that takes no decision lock: no hold, only the server's time (60 ms of sleep).
    await transact('SELECT 1 FROM pg_sleep(0.06)', []);

    expect(observed).toHaveLength(2);
    const [decision, sleep] = observed as [RoundTripTiming, RoundTripTiming];
    expect(decision.serverMs).toBeLessThanOrEqual(decision.roundTripMs + 1);
    expect(decision.lockHeldMs).not.toBeNull();
    expect(decision.lockHeldMs!).toBeGreaterThan(0);
    // The wait (most of the other's 300 ms; its start depends on when the message arrived) is in
    // the server's time and not in the hold.
    expect(decision.serverMs - decision.lockHeldMs!).toBeGreaterThanOrEqual(100);
    expect(sleep.lockHeldMs).toBeNull();
    expect(sleep.serverMs).toBeGreaterThanOrEqual(59);

    // The locks ended with the COMMIT before the clock was read, and the noted moment with them.
    const { rows } = await db.query<{ advisory: number; noted: string | null }>(
      `SELECT (SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS advisory,
              nullif(current_setting('runtime_cleanup.lock_taken_at', true), '') AS noted`,
    );
    expect(rows[0]).toEqual({ advisory: 0, noted: null });
  });

  it('an observed decision reports its own hold when the setting already has a value on the connection', async () => {
    // `runtime_cleanup.lock_taken_at` is an ordinary placeholder setting: a database or role
    // default, or a session-level SET left on a server connection that a transaction-mode pooler
    // hands to the next client, gives it a value before the decision runs. The decision function
    // keeps a value it finds (the first lock of the transaction wins), so the observed message
    // would report that value's age as the hold: years for a number, NaN for anything else.
    for (const stale of ['1000', 'not-a-number']) {
      await bench.t.db.query(
        `ALTER DATABASE "${bench.t.name}" SET runtime_cleanup.lock_taken_at = '${stale}'`,
      );
      // A fresh pool straight to the server (a pooler would hand out server connections made
      // before the ALTER): new server connections start with the database's default.
      const db = await openDatabase({
        url: directUrl(bench.t.name),
        driver: bench.t.driver,
        wsProxy: bench.t.wsProxy,
        maxConnections: 1,
        lockTimeoutMs: 5_000,
        statementTimeoutMs: 30_000,
      });
      try {
        const s = await finishedRootRun(bench.t.db);
        const observed: RoundTripTiming[] = [];
        await observedTransact(db, (t) => observed.push(t))(
          'SELECT decision FROM runtime_cleanup_fence_check($1::text)',
          [s.rootRunId],
        );
        const [timing] = observed as [RoundTripTiming];
        expect(timing.lockHeldMs).not.toBeNull();
        expect(Number.isFinite(timing.lockHeldMs)).toBe(true);
        expect(timing.lockHeldMs!).toBeGreaterThanOrEqual(0);
        expect(timing.lockHeldMs!).toBeLessThanOrEqual(timing.serverMs);
        // The connection's own value is left as it was: the message only shadows it locally.
        const { rows } = await db.query<{ value: string }>(
          "SELECT current_setting('runtime_cleanup.lock_taken_at') AS value",
        );
        expect(rows[0]!.value).toBe(stale);
      } finally {
        await db.end();
        await bench.t.db.query(`ALTER DATABASE "${bench.t.name}" RESET runtime_cleanup.lock_taken_at`);
      }
    }
  });

  it('each decision function notes when it took the scope lock, once per transaction', async () => {
    const s = await finishedRootRun(bench.t.db);
    await bench.t.db.withTransaction(async (tx) => {
      await tx.query('SELECT decision FROM runtime_cleanup_fence_check($1::text)', [s.rootRunId]);
      const noted = async () =>
        (await tx.query<{ at: string }>("SELECT current_setting('runtime_cleanup.lock_taken_at') AS at"))
          .rows[0]!.at;
      const first = await noted();
      expect(Number(first)).toBeGreaterThan(0);
      // A second decision in the same transaction (the lock is already held): the first moment stays.
      await tx.query('SELECT pg_sleep(0.02)');
      await tx.query(
        'SELECT decision FROM runtime_cleanup_finalize($1::text, $2::text, $3::text, NULL, NULL, NULL, NULL)',
        [s.rootRunId, s.uid, s.runtimeScopeId],
      );
      expect(await noted()).toBe(first);
      await tx.query('SELECT pg_sleep(0)');
    });
  });
});
