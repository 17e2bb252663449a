/**
 * The p-th percentile (0..100) of ascending `sorted` values by nearest rank: the smallest value
 * with at least p % of the values at or below it. Undefined for no values. Shared by the demo's
 * summary, the chaos report and the benchmarks, so their p50/p99 mean the same thing.
 */
export function nearestRank(sorted: readonly number[], p: number): number | undefined {
  if (sorted.length === 0) return undefined;
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil((p / 100) * sorted.length)));
  return sorted[rank - 1];
}

export function ascending(values: readonly number[]): number[] {
  return [...values].sort((a, b) => a - b);
}
