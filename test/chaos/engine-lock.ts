/**
 * One chaos engine at a time in a test run. chaos.test.ts and coverage.test.ts each drive an
 * engine of 20 concurrent runs, a backend terminator and the probes; two at once on two cores
 * starved fault-free DELETEs past their 1 s timeout, and each miss kept a scope quarantined 11 s
 * more (20.7–25.5 s of convergence, one at a time 13–17 s). Alone (`npm test`), the chaos tier runs
 * one file at a time after the others and this lock is never contended; in a merged run
 * (vitest.config.ts) it runs beside the other tiers, whose workers yield the CPU to it
 * (test/support/cpu-priority.ts), and the engines take turns here.
 */
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { commandArgs } from '../support/commands.ts';
import { withFileLock } from '../support/file-lock.ts';
import { type ChaosOptions, runChaos } from './engine.ts';
import { COVERAGE_CYCLE } from './plan.ts';
import type { ChaosResult } from './result.ts';
import { startChaosWatchdog } from './watchdog.ts';

/** Longer than an engine's run on a loaded machine (coverage.test.ts once took 180 s). */
export const ENGINE_LOCK_WAIT_MS = 240_000;

/**
 * Per Vitest run: its workers' parent is the run's main process, whose global setup removes it and
 * its queue at teardown (global-setup.ts). A separate run (the CLI's `npm run chaos`) is not held.
 */
export function engineLockDir(mainPid: number = process.ppid): string {
  return join(tmpdir(), `runtime-cleanup-chaos-engine-${mainPid}.lock`);
}

export function oneEngineAtATime<T>(work: () => Promise<T>): Promise<T> {
  return withFileLock(engineLockDir(), work, { waitMs: ENGINE_LOCK_WAIT_MS });
}

/** How long an engine of the suite may go without finishing a stage before its watchdog reports it. */
const ENGINE_OVERDUE_MS = 240_000;

/**
 * The coverage cycle of `npm test`'s chaos files (chaos.test.ts, coverage.test.ts): every forced
 * kind once, in two waves, the random runs being the CLI's business; the engine in its turn and
 * under its watchdog. `options` is what the file tests on top: its seed, its fault mix, its logs.
 */
export function runCoverageCycleInTurn(
  file: string,
  options: Omit<
    ChaosOptions,
    'runs' | 'concurrency' | 'coverage' | 'stormWorkerArgs' | 'onStage' | 'onProgress'
  >,
): Promise<ChaosResult> {
  return oneEngineAtATime(async () => {
    const watchdog = startChaosWatchdog(file, ENGINE_OVERDUE_MS);
    try {
      return await runChaos({
        ...options,
        runs: COVERAGE_CYCLE.length,
        concurrency: Math.ceil(COVERAGE_CYCLE.length / 2),
        coverage: true,
        stormWorkerArgs: commandArgs('termination-storm-child'),
        onStage: watchdog.onStage,
        onProgress: watchdog.onProgress,
      });
    } finally {
      watchdog.stop();
    }
  });
}
