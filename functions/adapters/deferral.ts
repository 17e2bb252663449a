/**
 * A deferral (a run still active in the scope) is not a failure: the fence is healthy and must not
 * be dead-lettered for waiting. Each deferral is re-sent as a fresh message with a delay that
 * grows exponentially up to CLEANUP_RETRY_MAX_SECONDS (and SQS's 900 s delay cap), which keeps the
 * re-checks cheap without spinning. After MAX_DEFERRALS the chain stops and the sweeper, which
 * re-announces every fence pending longer than FENCE_SWEEP_AFTER_SECONDS, guarantees a later look;
 * the durable fence itself is never dropped.
 */
import { backoffSeconds, MAX_SQS_DELAY_SECONDS } from './backoff.ts';

export const MAX_DEFERRALS = 12;

/**
 * The message attribute the cleanup's own deferred re-send carries beside the body's `deferrals`.
 * `run-finished` is a public queue: the platform (or a sloppy integration copying bodies around)
 * may send `{"runId": …, "deferrals": 11}` and cut the chain short, or a huge or negative number.
 * The body's count is trusted only when this attribute, which only announceRunFinished sets,
 * repeats it, and only within 1…MAX_DEFERRALS; anything else starts the chain afresh. (A sender
 * with send rights could forge both: keeping those to the platform and this system is IAM's job;
 * the worst it can do is end a chain early, after which the sweeper announces the fence again.)
 */
export const DEFERRALS_ATTRIBUTE = 'cleanupDeferrals';

export function trustedDeferrals(
  bodyDeferrals: number | undefined,
  attributeValue: string | undefined,
): number | undefined {
  if (bodyDeferrals === undefined || attributeValue === undefined) return undefined;
  if (!/^\d{1,5}$/.test(attributeValue) || Number(attributeValue) !== bodyDeferrals) return undefined;
  return bodyDeferrals >= 1 && bodyDeferrals <= MAX_DEFERRALS ? bodyDeferrals : undefined;
}

export function nextDeferral(
  previousDeferrals: number | undefined,
  policy: { baseSeconds: number; maxSeconds: number },
): { deferrals: number; delaySeconds: number } | undefined {
  const deferrals = (previousDeferrals ?? 0) + 1;
  if (deferrals > MAX_DEFERRALS) return undefined;
  return { deferrals, delaySeconds: Math.min(MAX_SQS_DELAY_SECONDS, backoffSeconds(deferrals, policy)) };
}

/**
 * Restarts of the chain at phase 1 (finalize finding the identity changed, the release guard
 * finding the scope active or the generation released or another sandbox) are counted like
 * deferrals, on their own count: a cause that persists (a platform reconciler re-creating the
 * sandbox of a fenced scope after every delete, two sessions disagreeing about the fence) would
 * otherwise be a hot loop with one provisioner DELETE per lap and no end. Each restart waits the
 * backoff delay; after MAX_RESTARTS the message is dead-lettered with IDENTITY_UNSTABLE (the fence
 * stays up, and the sweeper announces it again, a new chain, once it is due).
 *
 * The count travels in every body of the chain (run-finished, release, finalize) and, on the
 * public run-finished queue, is trusted only with RESTARTS_ATTRIBUTE beside it, as for deferrals.
 */
export const MAX_RESTARTS = 5;
export const RESTARTS_ATTRIBUTE = 'cleanupRestarts';

export function trustedRestarts(
  bodyRestarts: number | undefined,
  attributeValue: string | undefined,
): number | undefined {
  if (bodyRestarts === undefined || attributeValue === undefined) return undefined;
  if (!/^\d{1,5}$/.test(attributeValue) || Number(attributeValue) !== bodyRestarts) return undefined;
  return bodyRestarts >= 1 && bodyRestarts <= MAX_RESTARTS ? bodyRestarts : undefined;
}

/** The next restart of the chain and its delay, or undefined once MAX_RESTARTS were spent. */
export function nextRestart(
  previousRestarts: number | undefined,
  policy: { baseSeconds: number; maxSeconds: number },
): { restarts: number; delaySeconds: number } | undefined {
  const restarts = (previousRestarts ?? 0) + 1;
  if (restarts > MAX_RESTARTS) return undefined;
  return { restarts, delaySeconds: Math.min(MAX_SQS_DELAY_SECONDS, backoffSeconds(restarts, policy)) };
}
