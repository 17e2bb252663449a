import { type Database, WAIT_FOR_ROW_LOCKS } from '../cleanup/executor.ts';

/**
 * ForcedClears, counted where CloudWatch can see it. An operator's `ops force-clear` writes its
 * audit row in the database; the sweeper, which runs deployed every FENCE_SWEEP_INTERVAL_SECONDS
 * and already reports the fence backlog, claims the rows it has not reported yet and emits their
 * number. One statement claims and counts, so each forced clear is counted once however many
 * sweepers run (a second one waits on the row locks and then finds the rows claimed).
 *
 * That second sweeper's re-check is READ COMMITTED's: under REPEATABLE READ or SERIALIZABLE the
 * wait ends in SQLSTATE 40001 instead, and the tick fails. So the statement runs in a transaction
 * that pins READ COMMITTED (`Database.transact`), whatever the database's or role's default.
 */
const CLAIM_UNREPORTED = `
  WITH reported AS (
    UPDATE runtime_cleanup_overrides SET metric_reported_at = now()
    WHERE metric_reported_at IS NULL
    RETURNING 1
  )
  SELECT count(*)::int AS forced_clears FROM reported`;

export async function countNewForcedClears(db: Pick<Database, 'transact'>): Promise<number> {
  const { rows } = await db.transact<{ forced_clears: number }>(
    CLAIM_UNREPORTED,
    undefined,
    WAIT_FOR_ROW_LOCKS,
  );
  return rows[0]?.forced_clears ?? 0;
}
