import { describe, expect, it } from 'vitest';
import { ascending, nearestRank } from '../../infra/local/nearest-rank.ts';

describe('nearest-rank percentiles', () => {
  const hundred = ascending(Array.from({ length: 100 }, (_, i) => 100 - i));

  it('picks a value that really occurred: p50 and p99 of 1..100 are 50 and 99', () => {
    expect(nearestRank(hundred, 50)).toBe(50);
    expect(nearestRank(hundred, 99)).toBe(99);
    expect(nearestRank(hundred, 100)).toBe(100);
  });

  it('gives the smallest value for p0 and the only value of one sample', () => {
    expect(nearestRank(hundred, 0)).toBe(1);
    expect(nearestRank([7], 99)).toBe(7);
  });

  it('has no percentile of no values', () => {
    expect(nearestRank([], 50)).toBeUndefined();
  });
});
