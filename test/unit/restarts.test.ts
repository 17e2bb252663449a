import { describe, expect, it } from 'vitest';
import { MAX_RESTARTS, nextRestart, trustedRestarts } from '../../functions/adapters/deferral.ts';

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

  it('trusts a body count only with the same count in the attribute, and only within the bound', () => {
    expect(trustedRestarts(3, '3')).toBe(3);
    expect(trustedRestarts(3, undefined)).toBeUndefined();
    expect(trustedRestarts(3, '2')).toBeUndefined();
    expect(trustedRestarts(MAX_RESTARTS + 1, String(MAX_RESTARTS + 1))).toBeUndefined();
    expect(trustedRestarts(0, '0')).toBeUndefined();
    expect(trustedRestarts(undefined, '3')).toBeUndefined();
  });
});
