/**
 * Latency summaries for the benchmark report. Percentiles are nearest-rank on the sorted samples
 * (the p99 of 100 samples is the 99th smallest, never an interpolation between two), so every
 * figure in the report is a latency that really happened.
 */
import { nearestRank } from '../../infra/local/nearest-rank.ts';
export interface Summary {
  count: number;
  p50: number;
  p99: number;
  max: number;
  mean: number;
}

/** Rounds to 0.01 ms: finer digits are below what a client-side timer on a shared VM can resolve. */
function round(value: number): number {
  return Math.round(value * 100) / 100;
}

export function percentile(sorted: readonly number[], p: number): number {
  return nearestRank(sorted, p) ?? Number.NaN;
}

export function summarize(samples: readonly number[]): Summary {
  const sorted = [...samples].sort((a, b) => a - b);
  const total = sorted.reduce((sum, value) => sum + value, 0);
  return {
    count: sorted.length,
    p50: round(percentile(sorted, 50)),
    p99: round(percentile(sorted, 99)),
    max: round(sorted.at(-1) ?? Number.NaN),
    mean: round(sorted.length ? total / sorted.length : Number.NaN),
  };
}

/** `a / b` rounded to two digits; undefined when either side is missing or b is zero. */
export function ratio(a: number | undefined, b: number | undefined): number | undefined {
  if (a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0) {
    return undefined;
  }
  return Math.round((a / b) * 100) / 100;
}
