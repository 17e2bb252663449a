/**
 * How long one cleanup chain may keep going round, in one module: the two counts that travel
 * along a chain, how each next step is delayed, and when a count runs out.
 *
 * - **Deferrals.** A run still active in the scope is not a failure: the fence is healthy and must
 *   not be dead-lettered for waiting. Each deferral is re-sent as a fresh message with a delay that
 *   grows exponentially up to CLEANUP_RETRY_MAX_SECONDS (and SQS's 900 s delay cap), which keeps
 *   the re-checks cheap without spinning. After MAX_DEFERRALS the chain stops and the sweeper,
 *   which re-announces every fence pending longer than FENCE_SWEEP_AFTER_SECONDS, guarantees a
 *   later look; the durable fence itself is never dropped.
 * - **Restarts at phase 1** (finalize finding the identity changed; the release guard finding the
 *   scope active, the generation released or another sandbox) are counted the same way, on their
 *   own count: a cause that persists (a platform reconciler re-creating the sandbox of a fenced
 *   scope after every delete, two sessions disagreeing about the fence) would otherwise be a hot
 *   loop with one provisioner DELETE per lap and no end. After MAX_RESTARTS the message is
 *   dead-lettered with IDENTITY_UNSTABLE (the fence stays up, and the sweeper announces it again,
 *   a new chain, once it is due).
 *
 * Both counts travel in every body of the chain (run-finished, release, finalize). `run-finished`
 * is a public queue: the platform (or a sloppy integration copying bodies around) may send
 * `{"runId": …, "deferrals": 11}` and cut the chain short, or a huge or negative number. So a
 * body's count is trusted only when the message attribute that only the cleanup's own re-send sets
 * repeats it, and only within 1…its maximum; anything else starts the count afresh. (A sender with
 * send rights could forge both: keeping those to the platform and this system is IAM's job; the
 * worst it can do is end a chain early, after which the sweeper announces the fence again.)
 */
import { backoffSeconds, MAX_SQS_DELAY_SECONDS } from './backoff.ts';

export interface ChainCount {
  /** The message attribute that vouches for the body's count (set by the cleanup's own re-send). */
  readonly attribute: string;
  /** The most steps of this kind one chain may take. */
  readonly max: number;
}

export const DEFERRALS: ChainCount = { attribute: 'cleanupDeferrals', max: 12 };
export const RESTARTS: ChainCount = { attribute: 'cleanupRestarts', max: 5 };

export const MAX_DEFERRALS = DEFERRALS.max;
export const MAX_RESTARTS = RESTARTS.max;
export const DEFERRALS_ATTRIBUTE = DEFERRALS.attribute;
export const RESTARTS_ATTRIBUTE = RESTARTS.attribute;

/** The body's count of `kind`, if its attribute vouches for it; otherwise undefined (afresh). */
export function trustedCount(
  kind: ChainCount,
  bodyCount: number | undefined,
  attributeValue: string | undefined,
): number | undefined {
  if (bodyCount === undefined || attributeValue === undefined) return undefined;
  if (!/^\d{1,5}$/.test(attributeValue) || Number(attributeValue) !== bodyCount) return undefined;
  return bodyCount >= 1 && bodyCount <= kind.max ? bodyCount : undefined;
}

export interface RetryPolicy {
  baseSeconds: number;
  maxSeconds: number;
}

/** The next step of `kind` and its delay, or undefined once the chain has spent its maximum. */
export function nextStep(
  kind: ChainCount,
  previous: number | undefined,
  policy: RetryPolicy,
): { count: number; delaySeconds: number } | undefined {
  const count = (previous ?? 0) + 1;
  if (count > kind.max) return undefined;
  return { count, delaySeconds: Math.min(MAX_SQS_DELAY_SECONDS, backoffSeconds(count, policy)) };
}

/** The next deferral (`deferrals` as the bodies name it), or undefined past MAX_DEFERRALS. */
export function nextDeferral(
  previous: number | undefined,
  policy: RetryPolicy,
): { deferrals: number; delaySeconds: number } | undefined {
  const next = nextStep(DEFERRALS, previous, policy);
  return next && { deferrals: next.count, delaySeconds: next.delaySeconds };
}

/** The next restart at phase 1 (`restarts` as the bodies name it), or undefined past MAX_RESTARTS. */
export function nextRestart(
  previous: number | undefined,
  policy: RetryPolicy,
): { restarts: number; delaySeconds: number } | undefined {
  const next = nextStep(RESTARTS, previous, policy);
  return next && { restarts: next.count, delaySeconds: next.delaySeconds };
}
