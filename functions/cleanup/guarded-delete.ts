import { CleanupTimeoutError, deleteMayStillAct } from './errors.ts';
import { release } from './release.ts';
import type { SandboxProvider } from './sandbox-provider.ts';
import type { CleanupIdentity, ReleaseResult } from './types.ts';

/**
 * The one delete path: guard → DELETE → settle. Release (phase 2) and the reclaimer both delete
 * through it, so the rules that keep a DELETE from landing under a live run exist once:
 *
 * 1. **Guard.** One statement under the scope's advisory lock (and, for a reclaim, the sandbox
 *    id's) decides whether the DELETE may go out, and if so records that a delete is in flight
 *    until a deadline covering the whole attempt: `holdSeconds` from now, the attempt's bound plus
 *    the provisioner's own delete time plus a margin (`deleteInFlightSeconds`). While the record is
 *    live the platform admits no run to the scope (`runtime_cleanup_blocked`) and force-clear
 *    refuses. No lock outlives the statement.
 * 2. **Not too late.** A worker frozen between the guard and the DELETE (a Lambda environment
 *    frozen and thawed later) could send a DELETE that acts after the record ended; the attempt then
 *    sends nothing.
 * 3. **DELETE.** Through the provider's keyed lock and the provisioner client, bounded by `boundMs`
 *    (`release`), with no transaction open.
 * 4. **Settle.** The record ends as soon as nothing of the attempt can act any more; while the
 *    provisioner may still carry a request out (no answer, a 5xx, a 202, a reset after the request
 *    may have been written — the client decides, `CleanupError.deleteMayStillAct` and
 *    `ReleaseResult.unansweredAttempts`), it is cut to `residualSeconds` from now instead (the
 *    provisioner's own delete time plus the margin) and left to expire. A settle that fails leaves
 *    the record to its deadline: never shorter than it must be.
 */

/**
 * Time added to every in-flight deadline for what no timer here measures: the guard's answer
 * travelling back before the attempt starts its own deadline, a request still in transit to the
 * provisioner when the attempt gives up on it, a process descheduled for a moment. Each is
 * milliseconds on a healthy path; seconds under a stalled network. A longer margin only keeps a
 * scope blocked longer after a delete that ended without an answer.
 */
export const DELETE_IN_FLIGHT_MARGIN_SECONDS = 10;

/**
 * How long, from the guard, a delete it lets through may still act at the provisioner: the whole
 * attempt's bound (our side sends and waits no longer than that), plus the provisioner's own time
 * to carry out a request it received (SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS, the bound the
 * configuration's timeout ladder already assumes of it), plus the margin, plus how long the guard
 * itself may wait for its locks (`guardWaitMs`): the database starts the deadline once it holds
 * them, while this process can only count from when it sent the guard, so without it a guard that
 * waited for a busy lock would leave the attempt "too late" to send (step 2).
 */
export function deleteInFlightSeconds(
  boundMs: number,
  provisionerDeleteTimeoutSeconds: number,
  guardWaitMs = 0,
): number {
  return (boundMs + guardWaitMs) / 1000 + provisionerDeleteTimeoutSeconds + DELETE_IN_FLIGHT_MARGIN_SECONDS;
}

/** How long a request this process stopped waiting for may still act at the provisioner. */
export function residualDeleteSeconds(provisionerDeleteTimeoutSeconds: number): number {
  return provisionerDeleteTimeoutSeconds + DELETE_IN_FLIGHT_MARGIN_SECONDS;
}

/** How an attempt ended, as its settle step needs to know it. */
export type DeleteEnding =
  /** The guard's record was written but the DELETE was never sent. */
  | { kind: 'not_sent' }
  /**
   * The provisioner answered with a confirmation (`result.outcome`). `residualSeconds` is set when
   * an earlier request of the attempt went unanswered and may still act.
   */
  | { kind: 'answered'; result: ReleaseResult; residualSeconds: number | undefined }
  /** The attempt failed; `residualSeconds` is set when its DELETE may still act. */
  | { kind: 'failed'; error: unknown; residualSeconds: number | undefined };

export type GuardAnswer<Record, Refusal> =
  | { proceed: true; record: Record }
  | { proceed: false; refusal: Refusal };

export interface GuardedDelete<Record, Refusal> {
  /** What is deleted, and the key of the provider's in-process keyed lock (uid, scope). */
  target: Pick<CleanupIdentity, 'runId' | 'uid' | 'runtimeScopeId' | 'sandboxId' | 'generation'>;
  provider: SandboxProvider;
  /** The whole attempt's bound: the keyed lock wait and the DELETE. */
  boundMs: number;
  provisionerDeleteTimeoutSeconds: number;
  /** The longest the guard statement waits for its locks (its `lock_timeout`). */
  guardWaitMs: number;
  /** The guard statement, told how long from now its record must cover. */
  guard(holdSeconds: number): Promise<GuardAnswer<Record, Refusal>>;
  /** Ends (or cuts) the guard's record; a failure leaves it to its deadline. */
  settle(record: Record, ending: DeleteEnding): Promise<void>;
  /** The clock (epoch ms); tests inject one. */
  now?: () => number;
}

export type GuardedDeleteResult<Refusal> =
  | { kind: 'refused'; refusal: Refusal }
  | { kind: 'not_sent'; error: CleanupTimeoutError; settleError?: unknown }
  | { kind: 'answered'; result: ReleaseResult; residualSeconds: number | undefined; settleError?: unknown }
  | { kind: 'failed'; error: unknown; residualSeconds: number | undefined; settleError?: unknown };

export async function deleteBehindGuard<Record, Refusal>(
  steps: GuardedDelete<Record, Refusal>,
): Promise<GuardedDeleteResult<Refusal>> {
  const now = steps.now ?? Date.now;
  const holdSeconds = deleteInFlightSeconds(
    steps.boundMs,
    steps.provisionerDeleteTimeoutSeconds,
    steps.guardWaitMs,
  );
  const residualSeconds = residualDeleteSeconds(steps.provisionerDeleteTimeoutSeconds);
  // The record's end on this clock, read before the guard: the database set its deadline later
  // than this, so this never overstates it, whatever the skew between the two clocks.
  const protectedUntilMs = now() + holdSeconds * 1000;
  const answer = await steps.guard(holdSeconds);
  if (!answer.proceed) return { kind: 'refused', refusal: answer.refusal };
  const { record } = answer;

  const settle = async (ending: DeleteEnding): Promise<unknown> => {
    try {
      await steps.settle(record, ending);
      return undefined;
    } catch (error) {
      return error;
    }
  };

  // The DELETE may take its whole bound, and the provisioner may act for its delete time after
  // that: sent later than this, it could act after the record ended.
  if (now() + steps.boundMs + steps.provisionerDeleteTimeoutSeconds * 1000 > protectedUntilMs) {
    const settleError = await settle({ kind: 'not_sent' });
    const error = new CleanupTimeoutError(
      'the guard answered too late: the DELETE could still act after its delete-in-flight record ends; not sent',
      { runId: steps.target.runId, sandboxId: steps.target.sandboxId, holdSeconds },
      { deleteMayStillAct: false },
    );
    return settleError === undefined ? { kind: 'not_sent', error } : { kind: 'not_sent', error, settleError };
  }

  let result: ReleaseResult;
  try {
    result = await release(
      { ...steps.target, workdirPath: '', fenceSetAt: null },
      { provider: steps.provider, runtimeCleanupTimeoutMs: steps.boundMs },
    );
  } catch (error) {
    const residual = deleteMayStillAct(error) ? residualSeconds : undefined;
    const settleError = await settle({ kind: 'failed', error, residualSeconds: residual });
    return withSettleError({ kind: 'failed', error, residualSeconds: residual }, settleError);
  }
  const residual = result.unansweredAttempts ? residualSeconds : undefined;
  const settleError = await settle({ kind: 'answered', result, residualSeconds: residual });
  return withSettleError({ kind: 'answered', result, residualSeconds: residual }, settleError);
}

function withSettleError<T extends object>(result: T, settleError: unknown): T & { settleError?: unknown } {
  return settleError === undefined ? result : { ...result, settleError };
}
