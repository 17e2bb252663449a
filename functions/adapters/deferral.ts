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

export function nextDeferral(
  previousDeferrals: number | undefined,
  policy: { baseSeconds: number; maxSeconds: number },
): { deferrals: number; delaySeconds: number } | undefined {
  const deferrals = (previousDeferrals ?? 0) + 1;
  if (deferrals > MAX_DEFERRALS) return undefined;
  return { deferrals, delaySeconds: Math.min(MAX_SQS_DELAY_SECONDS, backoffSeconds(deferrals, policy)) };
}
