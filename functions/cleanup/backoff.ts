/**
 * Exponential backoff with "equal jitter": half the capped delay is fixed, half random. Full
 * jitter could pick ~0 s and retry a struggling provisioner at once; no jitter would make every
 * cleanup that failed together retry together.
 *
 *   attempt 1 → base, attempt n → base·2^(n-1), capped at max; result in [d/2, d].
 */
export function backoffSeconds(
  attempt: number,
  policy: { baseSeconds: number; maxSeconds: number },
  random: () => number = Math.random,
): number {
  const exponent = Math.min(Math.max(attempt, 1) - 1, 30);
  const capped = Math.min(policy.maxSeconds, policy.baseSeconds * 2 ** exponent);
  return Math.max(1, Math.round(capped / 2 + random() * (capped / 2)));
}

/** SQS accepts at most 900 s of DelaySeconds on a message. */
export const MAX_SQS_DELAY_SECONDS = 900;
