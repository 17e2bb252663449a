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
import { readdirSync, writeFileSync } from 'node:fs';
import { getPriority, setPriority } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';

/** CFS weight 110 against 1024 at nice 0: under contention the engine gets about nine tenths. */
export const YIELDING_NICENESS = 10;

/**
 * Setup of the tiers that yield: idempotent, Vitest loads it again for each test file. On Linux a
 * priority is a thread's, and `setPriority(n)` sets the calling thread's alone: the worker's other
 * threads (V8's compiler and GC helpers, libuv's pool, started before this file ran) are set one by
 * one. Threads started later inherit it from the thread that starts them.
 */
export function yieldCpu(niceness: number = YIELDING_NICENESS): void {
  if (getPriority() < niceness) setPriority(niceness);
  for (const thread of threadsOfThisProcess()) {
    try {
      if (getPriority(thread) < niceness) setPriority(thread, niceness);
    } catch {
      // The thread ended meanwhile.
    }
  }
}

function threadsOfThisProcess(): number[] {
  try {
    return readdirSync('/proc/self/task').map(Number);
  } catch {
    return []; // Not Linux: the process's priority is all there is.
  }
}

/**
 * A child started in a session of its own (`setsid`: test/support/child-process.ts's process
 * groups, such as `npm run package`) yields too. With the kernel's autogroup scheduling (on by
 * default on desktop and many server kernels), CPU is shared between sessions first and by nice
 * only within one: a new session at the autogroup's nice 0 would weigh as much as the whole Vitest
 * run, chaos engine included, whatever its processes' own nice. Its autogroup gets this process's
 * yielding nice; raising it needs no privilege. Without autogroup (or off Linux) there is nothing to
 * set and the child's inherited nice already holds.
 */
export async function yieldSessionOf(pid: number, niceness: number = YIELDING_NICENESS): Promise<void> {
  if (getPriority() < niceness) return;
  for (let attempt = 1; ; attempt += 1) {
    try {
      writeFileSync(`/proc/${pid}/autogroup`, String(niceness));
      return;
    } catch (error) {
      // Without CAP_SYS_ADMIN the kernel takes one autogroup nice every 100 ms, machine-wide:
      // another worker's child may have had it a moment ago. Anything else (no autogroup here, the
      // child gone already) leaves nothing to set.
      const busy = (error as NodeJS.ErrnoException).code === 'EAGAIN';
      if (!busy || attempt >= AUTOGROUP_ATTEMPTS) return;
      await sleep(AUTOGROUP_RETRY_MS);
    }
  }
}

const AUTOGROUP_ATTEMPTS = 10;
const AUTOGROUP_RETRY_MS = 110;

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
