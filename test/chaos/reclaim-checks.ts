/**
 * The invariants of the reclaimer's fault kinds (reclaim-faults.ts), as pure functions of what the
 * faults recorded, so that test/harness/chaos-reclaim-checks.test.ts can feed them known-bad
 * histories:
 *
 * - K: a reclaimed (sandbox, generation) cannot be recorded again right after its DELETE, even when
 *   the statement after the DELETE failed: the tombstone laid before the DELETE refuses it with
 *   SQLSTATE 55006 (the trigger sandbox_runtimes_refuse_reclaimed). Reclaimer bug 3 laid it only
 *   after the DELETE, so a failure there left the id recordable. Tried right after the DELETE and,
 *   when the grace outlasts the guard's in-flight record (`--reclaim-grace`), once more after it,
 *   where the tombstone alone refuses.
 * - Q: in a quiet window (no run active, only leaks live), every leak is reclaimed within the grace
 *   plus two reclaimer runs (counted in runs, not seconds: quietLeakDueBy), with the brakes at the
 *   product's defaults: reclaimer bug 6 had them refuse every such listing, forever.
 * - N: a deterministic id (no generation from the provisioner) reclaimed, the conversation's next
 *   record of it is accepted within the delete window plus margin (the guard's hold) of the
 *   DELETE, never refused for a whole grace: reclaimer bug 7 locked the conversation out for it.
 */
import { Invariant, type Violation } from './invariants.ts';
import {
  type LateRecordAttempt,
  type QuietWindow,
  quietLeakDueBy,
  type ReusedIdAttempt,
} from './reclaim-faults.ts';

/** The refusal of sandbox_runtimes_refuse_reclaimed (object_in_use). */
export const RECLAIM_REFUSAL_SQLSTATE = '55006';

export function judgeLateRecords(attempts: readonly LateRecordAttempt[]): {
  violations: Violation[];
  checked: number;
} {
  const violations: Violation[] = [];
  for (const attempt of attempts) {
    if (attempt.refusal?.code === RECLAIM_REFUSAL_SQLSTATE) continue;
    violations.push({
      invariant: Invariant.RECLAIMED_GENERATION_REFUSED,
      key: `K:${attempt.sandboxId}#${attempt.generation}:${attempt.phase}`,
      message: `${attempt.sandboxId} generation ${attempt.generation}, deleted by the reclaimer (the statement after its DELETE ${attempt.settleFailedBy === 'terminated' ? 'terminated' : 'timed out on its lock'}), was ${attempt.refusal === null ? 'recorded again' : `refused with ${attempt.refusal.code ?? 'no SQLSTATE'} (${attempt.refusal.message}), not the tombstone's ${RECLAIM_REFUSAL_SQLSTATE}`} ${attempt.msAfterDelete} ms after the delete (${attempt.phase === 'while-in-flight' ? "the guard's in-flight record still up" : "after the guard's in-flight record, within the grace: only the tombstone refuses"})`,
      details: { ...attempt },
    });
  }
  return { violations, checked: attempts.length };
}

export function judgeQuietFleet(windows: readonly QuietWindow[]): {
  violations: Violation[];
  checked: number;
} {
  const violations: Violation[] = [];
  let checked = 0;
  for (const window of windows) {
    for (const leak of window.leaks) {
      checked += 1;
      const dueByMs = quietLeakDueBy(leak, window.reclaimerRuns, window.graceMs);
      if (leak.goneAtMs !== undefined && (dueByMs === undefined || leak.goneAtMs <= dueByMs)) continue;
      const after = window.reclaimerRuns.filter((run) => run.startedAtMs >= leak.createdAtMs);
      const runs = after.length;
      const outcomes = [...new Set(after.map((run) => run.outcome))].join('; ');
      const tookMs = leak.goneAtMs === undefined ? undefined : leak.goneAtMs - leak.createdAtMs;
      violations.push({
        invariant: Invariant.QUIET_FLEET_RECLAIMED,
        key: `Q:${leak.sandboxId}`,
        message: `${leak.sandboxId}, leaked while no run was active and only leaks were live, was ${tookMs === undefined ? `never reclaimed (${runs} reclaimer run(s) after it leaked${dueByMs === undefined ? `, too few${after.some((run) => run.impeded) ? ' that no injected fault impeded' : ''} to reach its bound: the reclaimer stopped running?` : ''})` : `reclaimed only after ${Math.round(tookMs)} ms, later than the second reclaimer run after its grace (${runs} run(s) after it leaked)`} (bound: grace + two reclaimer runs; grace ${window.graceMs} ms; the runs said: ${outcomes || 'nothing'})`,
        details: { ...leak, graceMs: window.graceMs, dueByMs, tookMs, reclaimerRuns: window.reclaimerRuns },
      });
    }
  }
  return { violations, checked };
}

export function judgeReusedIds(attempts: readonly ReusedIdAttempt[]): {
  violations: Violation[];
  checked: number;
} {
  const violations: Violation[] = [];
  for (const attempt of attempts) {
    const tookMs =
      attempt.acceptedAtMs === undefined ? undefined : attempt.acceptedAtMs - attempt.deletedAtMs;
    if (tookMs !== undefined && tookMs <= attempt.boundMs) continue;
    violations.push({
      invariant: Invariant.DETERMINISTIC_ID_RECORDABLE_AFTER_RECLAIM,
      key: `N:${attempt.sandboxId}#${Math.round(attempt.deletedAtMs)}`,
      message: `${attempt.sandboxId}, a deterministic id the reclaimer deleted, ${tookMs === undefined ? 'was never recorded again' : `was recorded again only ${Math.round(tookMs)} ms after the DELETE`} (${attempt.refused} refusal(s); bound: the delete window plus margin, ${attempt.boundMs} ms; the grace is ${attempt.graceMs} ms)`,
      details: { ...attempt, tookMs },
    });
  }
  return { violations, checked: attempts.length };
}
