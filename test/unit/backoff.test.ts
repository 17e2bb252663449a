/**
 * Exponential backoff with equal jitter: attempt n waits between half and all of
 * min(max, base·2^(n-1)) seconds, never less than 1 s.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { backoffSeconds } from '../../functions/cleanup/backoff.ts';

const contractDefaults = { baseSeconds: 10, maxSeconds: 900 };
const lowest = () => 0;
const highest = () => 1 - Number.EPSILON;

function cappedDelay(attempt: number, policy: { baseSeconds: number; maxSeconds: number }): number {
  return Math.min(policy.maxSeconds, policy.baseSeconds * 2 ** (Math.max(attempt, 1) - 1));
}

const policies = fc
  .tuple(fc.integer({ min: 1, max: 3_600 }), fc.integer({ min: 0, max: 100_000 }))
  .map(([baseSeconds, extra]) => ({ baseSeconds, maxSeconds: baseSeconds + extra }));

describe('backoffSeconds', () => {
  it('doubles from the base: 10, 20, 40 … seconds at the top of the jitter range with the contract defaults', () => {
    expect(
      [1, 2, 3, 4, 5, 6, 7].map((attempt) => backoffSeconds(attempt, contractDefaults, highest)),
    ).toEqual([10, 20, 40, 80, 160, 320, 640]);
  });

  it('caps the delay at CLEANUP_RETRY_MAX_SECONDS however many attempts came before', () => {
    for (const attempt of [8, 9, 30, 31, 1_000, Number.MAX_SAFE_INTEGER]) {
      expect(backoffSeconds(attempt, contractDefaults, highest)).toBe(900);
      expect(backoffSeconds(attempt, contractDefaults, lowest)).toBe(450);
    }
  });

  it('treats attempt 0 and negative attempts as the first', () => {
    expect(backoffSeconds(0, contractDefaults, highest)).toBe(10);
    expect(backoffSeconds(-5, contractDefaults, highest)).toBe(10);
  });

  it('stays within [capped/2, capped], at least 1 s, for any policy, attempt and random draw', () => {
    fc.assert(
      fc.property(
        policies,
        fc.integer({ min: -3, max: 200 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (policy, attempt, draw) => {
          const capped = cappedDelay(attempt, policy);
          const delay = backoffSeconds(attempt, policy, () => draw);
          expect(Number.isInteger(delay)).toBe(true);
          expect(delay).toBeGreaterThanOrEqual(Math.max(1, Math.floor(capped / 2)));
          expect(delay).toBeLessThanOrEqual(Math.max(1, capped));
          expect(delay).toBeLessThanOrEqual(policy.maxSeconds);
        },
      ),
    );
  });

  it('never lowers the range as attempts grow (both ends of the jitter range are monotone)', () => {
    fc.assert(
      fc.property(policies, fc.integer({ min: 1, max: 100 }), (policy, attempt) => {
        for (const draw of [lowest, highest]) {
          expect(backoffSeconds(attempt + 1, policy, draw)).toBeGreaterThanOrEqual(
            backoffSeconds(attempt, policy, draw),
          );
        }
      }),
    );
  });

  it('spreads retries that failed together: real random draws cover the jitter range', () => {
    const delays = Array.from({ length: 2_000 }, () => backoffSeconds(5, contractDefaults));
    expect(Math.min(...delays)).toBeGreaterThanOrEqual(80);
    expect(Math.max(...delays)).toBeLessThanOrEqual(160);
    // Equal jitter: a wide spread, not a few clustered values.
    expect(new Set(delays).size).toBeGreaterThan(50);
    expect(Math.min(...delays)).toBeLessThan(90);
    expect(Math.max(...delays)).toBeGreaterThan(150);
  });
});
