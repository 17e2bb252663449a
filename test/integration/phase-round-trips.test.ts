import { describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
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

describe('one round trip per decision, locks included', () => {
  it('phase 1, the release guard and phase 3: one message each, one transaction each', async () => {
    const db = await fixture.t.connect({ maxConnections: 1 });
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
    const db = await fixture.t.connect({ maxConnections: 1 });
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
});
