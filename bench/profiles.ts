/**
 * What a run measures. `quick` is a smoke check (about a minute on a quiet machine): the same scenarios with fewer
 * rounds and runs, so its percentiles rest on few samples. `full` is the one to publish.
 */
import type { LockScenarioProfile } from './locks/scenario.ts';
import type { ScaleProfile } from './scale/scenario.ts';

export interface BenchProfile {
  mode: 'quick' | 'full';
  locks: LockScenarioProfile & {
    deleteLatenciesMs: readonly number[];
    /** Rounds per design and delete latency: enough rounds that every figure rests on ≥ ~1 s of load. */
    rounds: (deleteLatencyMs: number) => number;
  };
  e2e: {
    deleteLatenciesMs: readonly number[];
    /** Runs announced one by one at `pacedPerSecond`: latency and overhead, below saturation. */
    pacedRuns: number;
    pacedPerSecond: number;
    /** Runs announced all at once: throughput. */
    burstRuns: number;
    /**
     * Bursts per design and delete latency, the project's and the floor's interleaved (P F, F P, …);
     * the figures are the median burst's. One burst of 200 lasts a second or two, and on two shared
     * cores its cleanups/s moved by a quarter from one run to the next.
     */
    burstRepeats: number;
    /** Cleanups of the memory run (bursts of `burstRuns` back to back at delete latency 0): RSS start, peak, end. */
    memoryCleanups: number;
  };
  /** Part 3, fences at scale; skipped when absent (the quick run). */
  scale?: ScaleProfile;
}

const LOCK_LOAD = {
  scopes: 32,
  // About 200 operations per second in all: enough samples to see every lock a cleanup holds,
  // not so many that the load itself takes a large share of the two cores.
  leaseWorkers: 4,
  leasePeriodMs: 25,
  recoveryWorkers: 2,
  recoveryPeriodMs: 50,
  seed: 7,
} as const;

export const PROFILES: Record<'quick' | 'full', BenchProfile> = {
  quick: {
    mode: 'quick',
    locks: {
      ...LOCK_LOAD,
      // About a minute in all: two delete latencies, one round each.
      deleteLatenciesMs: [0, 500],
      rounds: () => 1,
    },
    e2e: {
      deleteLatenciesMs: [0, 200],
      pacedRuns: 20,
      pacedPerSecond: 20,
      burstRuns: 60,
      burstRepeats: 1,
      memoryCleanups: 120,
    },
  },
  full: {
    mode: 'full',
    locks: {
      ...LOCK_LOAD,
      deleteLatenciesMs: [0, 50, 500, 2000],
      rounds: (latency) => (latency >= 2000 ? 3 : latency >= 500 ? 4 : 10),
    },
    e2e: {
      deleteLatenciesMs: [0, 200],
      pacedRuns: 120,
      pacedPerSecond: 20,
      burstRuns: 200,
      burstRepeats: 5,
      // The local provisioner runs a real process per sandbox: 2,000 at once would not fit, so
      // ten bursts of 200 back to back.
      memoryCleanups: 2_000,
    },
    scale: { runs: 1_000_000, fences: 50_000, samples: 500 },
  },
};
