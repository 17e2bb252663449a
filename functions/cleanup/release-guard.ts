import { RunNotFoundError } from './errors.ts';
import type { Executor } from './executor.ts';
import { TERMINAL_RUN_STATUSES } from './types.ts';

/**
 * Just before phase 2 deletes, one plain read (autocommit, no transaction left open, no lock
 * taken) that the delete is still wanted. The fence normally guarantees it, but a release message
 * can outlive its fence: a late duplicate, an operator's redrive after a forced clear, or a
 * delivery after the fence was cleared and the scope's sandbox handed to a new run *with the same
 * generation* (a provisioner that reuses a live sandbox). The generation guard cannot tell those
 * apart; the fence can. Phase 3 still re-checks everything under the locks.
 */
const STILL_WANTED = `
  SELECT r.runtime_cleanup_pending AND r.runtime_cleanup_pending_since::text IS NOT DISTINCT FROM $2::text AS fence_current,
         (SELECT a.id FROM agent_runs a
           WHERE a.uid = r.uid AND a.runtime_scope_id = r.runtime_scope_id AND a.id <> r.id
             AND a.status <> ALL ($3::text[])
           LIMIT 1) AS active_run_id
  FROM agent_runs r
  WHERE r.id = $1::text`;

export const ReleaseGuard = {
  PROCEED: 'proceed',
  /** The fence was cleared (or raised anew) since phase 1: this release is stale, skip it. */
  FENCE_GONE: 'fence_gone',
  /** A run is active in the scope again: deleting now would pull the sandbox from under it. */
  SCOPE_ACTIVE: 'scope_active',
} as const;
export type ReleaseGuard = (typeof ReleaseGuard)[keyof typeof ReleaseGuard];

export async function checkReleaseStillWanted(
  db: Executor,
  identity: { runId: string; fenceSetAt: string | null },
): Promise<{ verdict: ReleaseGuard; activeRunId?: string }> {
  const { rows } = await db.query<{ fence_current: boolean; active_run_id: string | null }>(STILL_WANTED, [
    identity.runId,
    identity.fenceSetAt,
    TERMINAL_RUN_STATUSES,
  ]);
  const row = rows[0];
  // A run that does not exist is not a fence that went away: the contract parks such a message in
  // the DLQ with its reason (found by the chaos suite: hostile releases were acknowledged silently).
  if (!row) throw new RunNotFoundError(identity.runId);
  if (!row.fence_current) return { verdict: ReleaseGuard.FENCE_GONE };
  if (row.active_run_id) return { verdict: ReleaseGuard.SCOPE_ACTIVE, activeRunId: row.active_run_id };
  return { verdict: ReleaseGuard.PROCEED };
}
