import type { Database } from '../adapters/database.ts';
import { announceRunFinished } from '../adapters/publish.ts';
import type { Queues } from '../adapters/queues.ts';
import { WAIT_FOR_ROW_LOCKS } from '../cleanup/executor.ts';

/**
 * The reconciler's safety net: every root fence pending longer than FENCE_SWEEP_AFTER_SECONDS is
 * announced again on `run-finished`. It answers a run-finished event that was never sent, a
 * message that was dead-lettered, and a deferral chain that ran out. A fence is re-announced at
 * most once per FENCE_SWEEP_AFTER_SECONDS, and one tick handles at most SWEEP_BATCH_LIMIT fences
 * (oldest first), so a backlog drains over ticks instead of flooding the queue.
 *
 * Claiming uses `FOR UPDATE SKIP LOCKED`: two sweepers never announce the same fence in one
 * period, and a fence whose row a cleanup transaction holds is simply taken next tick.
 *
 * A fence's age runs from `runtime_cleanup_pending_since`; a fence raised by a write that
 * bypassed the trigger maintaining it (NULL there) is aged from when its run finished, else from
 * the row's last update, instead of being invisible to the claim, the backlog figures and the
 * oldest-fence alarm. Both statements are index scans (migration 006) whatever the backlog: the
 * claim reads exactly the due fences, in the order they became due.
 */
export const SWEEP_BATCH_LIMIT = 200;

/** Exported for the plan tests (test/integration/fence-scale.test.ts), which EXPLAIN it as called. */
export const CLAIM_DUE_FENCES = `
  WITH due AS (
    SELECT id FROM agent_runs
    WHERE runtime_cleanup_pending AND run_type <> 'subagent'
      AND greatest(coalesce(runtime_cleanup_pending_since, finished_at, updated_at), runtime_cleanup_announced_at)
          <= now() - make_interval(secs => $1::int)
    ORDER BY greatest(coalesce(runtime_cleanup_pending_since, finished_at, updated_at), runtime_cleanup_announced_at)
    LIMIT $2::int
    FOR UPDATE SKIP LOCKED
  )
  UPDATE agent_runs a SET runtime_cleanup_announced_at = now()
  FROM due WHERE a.id = due.id
  RETURNING a.id`;

/**
 * Gives a claim back when its announcement could not be sent, so the next tick tries again.
 * Exported for the chaos suite's classifier tests (test/harness/chaos-backend-phase.test.ts).
 */
export const UNCLAIM = `UPDATE agent_runs SET runtime_cleanup_announced_at = NULL WHERE id = ANY ($1::text[])`;

/** The count reads the partial index of pending fences only (no table rows): fine once a minute. */
export const FENCE_STATS = `
  SELECT count(*)::int AS pending,
         coalesce(extract(epoch FROM now() - min(coalesce(runtime_cleanup_pending_since, finished_at, updated_at))), 0)::float8
           AS oldest_age_seconds
  FROM agent_runs
  WHERE runtime_cleanup_pending AND run_type <> 'subagent'`;

export interface SweepResult {
  announced: string[];
  failed: string[];
  pendingFences: number;
  oldestFenceAgeSeconds: number;
}

export async function sweepFences(
  deps: { db: Database; queues: Queues },
  options: { sweepAfterSeconds: number; limit?: number },
): Promise<SweepResult> {
  const { db, queues } = deps;
  // Each statement is sent again once if its connection is lost; safe here: a repeated claim takes
  // the fences still due (a claim lost with its answer only waits one more period, as after a
  // crash), the unclaim is idempotent, and the stats are a read. The two writes run in a READ
  // COMMITTED transaction of their own (Database.transact): the claim locks rows a cleanup or the
  // platform may have changed since its snapshot, and the unclaim updates rows they may hold, which
  // under a database's or role's REPEATABLE READ default ended in SQLSTATE 40001 (the tick failed,
  // or a fence stayed claimed for a period with nobody announcing it).
  const claimed = await db.transact<{ id: string }>(CLAIM_DUE_FENCES, [
    options.sweepAfterSeconds,
    options.limit ?? SWEEP_BATCH_LIMIT,
  ]);
  const ids = claimed.rows.map((row) => row.id);
  const results = await Promise.allSettled(
    ids.map((id) => announceRunFinished(queues, id, { reason: 'sweeper' })),
  );
  const failed = ids.filter((_, index) => results[index]!.status === 'rejected');
  if (failed.length) await db.transact(UNCLAIM, [failed], WAIT_FOR_ROW_LOCKS);
  const stats = await db.query<{ pending: number; oldest_age_seconds: number }>(FENCE_STATS);
  return {
    announced: ids.filter((id) => !failed.includes(id)),
    failed,
    pendingFences: stats.rows[0]?.pending ?? 0,
    oldestFenceAgeSeconds: Math.round(stats.rows[0]?.oldest_age_seconds ?? 0),
  };
}
