/**
 * Who gets the CPU first in a merged run (RUNTIME_CLEANUP_TEST_PASSES=all, vitest.config.ts), where
 * the chaos tier runs beside every other tier instead of alone after them.
 *
 * The chaos suite asserts a convergence bound in seconds, derived from the configuration it runs
 * with (test/chaos/settings.ts); what the bound does not cover is CPU starvation. Beside four
 * workers of the other tiers at the same priority, a CI run measured 32.7 s against its 26.5 s.
 * So the other tiers' workers lower their own priority (nice 10), and every process they start
 * inherits it: they take the CPU the chaos engine leaves, which is most of it (an engine alone kept
 * a two-core machine 30–95 % idle), and the engine is served first when it wants some.
 *
 * Raising one's own niceness needs no privilege; lowering it back does, so a worker never tries.
 */
import { getPriority, setPriority } from 'node:os';

/** CFS weight 110 against 1024 at nice 0: under contention the engine gets about nine tenths. */
export const YIELDING_NICENESS = 10;

/** Setup of the tiers that yield: idempotent, Vitest loads it again for each test file. */
export function yieldCpu(): void {
  if (getPriority() < YIELDING_NICENESS) setPriority(YIELDING_NICENESS);
}

/**
 * Setup of the chaos tier: its worker must run at the priority of the Vitest run that started it.
 * A worker that inherited a yielding priority (a pool that reused a yielding tier's process) would
 * measure convergence starved, and fail on the bound for a reason the report would not show.
 */
export function assertFullCpuPriority(): void {
  const own = getPriority();
  const run = getPriority(process.ppid);
  if (own > run) {
    throw new Error(
      `the chaos tier's worker runs at nice ${own}, below its Vitest run's ${run}: its convergence bound assumes it is not starved of CPU (test/support/cpu-priority.ts)`,
    );
  }
}
