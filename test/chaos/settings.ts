/**
 * The chaos suite's configuration: the environment the stack runs with, the queues' visibility
 * timeouts, the timeouts the faults are placed around, and the convergence bound the suite
 * holds the cleanup to.
 */
import type { Timeouts } from './plan.ts';

/** The stack's database connections carry this name; terminations and the probe key on it. */
export const STACK_APPLICATION_NAME = 'runtime-cleanup-stack';

/**
 * The chaos configuration (the integration contract's variables). Timeouts are short so that
 * failures play out in seconds; their relations are the deployed ones (cleanup timeout > lock
 * wait + delete timeout).
 */
export const CHAOS_ENV = {
  CLEANUP_RETRY_BASE_SECONDS: '1',
  CLEANUP_RETRY_MAX_SECONDS: '2',
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '1',
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '1',
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '3',
  FENCE_SWEEP_AFTER_SECONDS: '4',
  FENCE_SWEEP_INTERVAL_SECONDS: '1',
  DATABASE_LOCK_TIMEOUT_MS: '500',
  DATABASE_STATEMENT_TIMEOUT_MS: '3000',
} as const;

/** Visibility timeouts of the consumed queues (the shape of the deployed ones, in seconds). */
export const CHAOS_VISIBILITY_SECONDS = {
  'run-finished': 4,
  'runtime-release.fifo': 8,
  'runtime-finalize': 4,
} as const;

export const CHAOS_TIMEOUTS: Timeouts = {
  provisionerDeleteMs: Number(CHAOS_ENV.SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS) * 1000,
  databaseLockMs: Number(CHAOS_ENV.DATABASE_LOCK_TIMEOUT_MS),
  runtimeCleanupMs: Number(CHAOS_ENV.SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS) * 1000,
};

/**
 * The stated convergence bound: once a run's faults stopped (and its scope went idle), its fence
 * clears within the longest way a cleanup can be delayed *without* faults, plus the time to run
 * the three phases on a loaded machine:
 *
 *   a message crashed in flight reappears after the release queue's visibility timeout (8 s),
 *   or a dead-lettered one is re-announced by the sweeper after FENCE_SWEEP_AFTER + one interval
 *   (4 + 1 s) — whichever path, at most max(8, 5) s;
 *   one retry backoff at CLEANUP_RETRY_MAX (2 s) for a failure that began just before the stop;
 *   an identity change restarts at phase 1 once (another chain) — bounded by 2 × the chain;
 *   the chain itself (three receives, two transactions, one delete) is sub-second unloaded; on
 *   two cores shared by 30–40 concurrent runs, a terminator and the probe, give it 5 s.
 *
 *   bound = 8 + 2 + 2 × 5 = 20 s
 */
export const CONVERGENCE_BOUND_MS = 20_000;

/** The consumed queues: every message sent to one must be taken off it (invariant 5). */
export const CONSUMED_QUEUES = ['run-finished', 'runtime-release.fifo', 'runtime-finalize'] as const;
