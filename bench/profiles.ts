/**
 * What a run measures. `quick` is a smoke check (about two minutes): the same scenarios with fewer
 * rounds and runs, so its percentiles rest on few samples. `full` is the one to publish.
 */
import type { LockScenarioProfile } from './locks/scenario.ts';

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
  };
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
      deleteLatenciesMs: [0, 50, 500, 2000],
      rounds: (latency) => (latency >= 500 ? 1 : 3),
    },
    e2e: { deleteLatenciesMs: [0, 200], pacedRuns: 30, pacedPerSecond: 20, burstRuns: 80 },
  },
  full: {
    mode: 'full',
    locks: {
      ...LOCK_LOAD,
      deleteLatenciesMs: [0, 50, 500, 2000],
      rounds: (latency) => (latency >= 2000 ? 3 : latency >= 500 ? 4 : 10),
    },
    e2e: { deleteLatenciesMs: [0, 200], pacedRuns: 120, pacedPerSecond: 20, burstRuns: 200 },
  },
};
