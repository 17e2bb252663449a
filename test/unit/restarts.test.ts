import { describe, expect, it } from 'vitest';
import {
  DEFERRALS,
  MAX_RESTARTS,
  nextRestart,
  RESTARTS,
  trustedCount,
} from '../../functions/cleanup/chain-limits.ts';

const POLICY = { baseSeconds: 10, maxSeconds: 900 };

describe('restarts of the chain at phase 1', () => {
  it('counts up to MAX_RESTARTS, each with a delay that grows, then stops', () => {
    const delays: number[] = [];
    let count: number | undefined;
    for (let i = 1; i <= MAX_RESTARTS; i += 1) {
      const next = nextRestart(count, POLICY);
      expect(next?.restarts).toBe(i);
      delays.push(next!.delaySeconds);
      count = next!.restarts;
    }
    expect(nextRestart(count, POLICY)).toBeUndefined();
    expect(delays[0]).toBeGreaterThanOrEqual(5);
    // Equal jitter: restart n waits within [d/2, d] of base·2^(n-1), so the last exceeds the first's cap.
    expect(delays.at(-1)).toBeGreaterThan(POLICY.baseSeconds);
  });

  it.each([
    ['restarts', RESTARTS],
    ['deferrals', DEFERRALS],
  ])(
    'trusts a body count of %s only with the same count in its attribute, and only within its bound',
    (_, kind) => {
      expect(trustedCount(kind, 3, '3')).toBe(3);
      expect(trustedCount(kind, 3, undefined)).toBeUndefined();
      expect(trustedCount(kind, 3, '2')).toBeUndefined();
      expect(trustedCount(kind, kind.max, String(kind.max))).toBe(kind.max);
      expect(trustedCount(kind, kind.max + 1, String(kind.max + 1))).toBeUndefined();
      expect(trustedCount(kind, 0, '0')).toBeUndefined();
      expect(trustedCount(kind, undefined, '3')).toBeUndefined();
      expect(trustedCount(kind, 3, '03x')).toBeUndefined();
    },
  );
});
