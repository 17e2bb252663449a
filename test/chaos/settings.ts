/**
 * The chaos suite's configuration: the environment the stack runs with, the queues' visibility
 * timeouts, the timeouts the faults are placed around, and the convergence bound the suite
 * holds the cleanup to.
 */
import { deleteInFlightSeconds } from '../../functions/cleanup/guarded-delete.ts';
import type { Timeouts } from './plan.ts';

/** The stack's database connections carry this name; terminations and the probe key on it. */
export const STACK_APPLICATION_NAME = 'runtime-cleanup-stack';

/**
 * The statement timeout of the harness's own pools (engine.ts), and so their idle-in-transaction
 * limit: a harness transaction held open longer (the REPEATABLE READ race's admission) is ended by
 * the server as a harness error.
 */
export const HARNESS_STATEMENT_TIMEOUT_MS = 20_000;

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

const seconds = (name: keyof typeof CHAOS_ENV) => Number(CHAOS_ENV[name]);

/**
 * How long a scope stays quarantined after a DELETE that may still act: the release guard's
 * in-flight record runs from the guard for the whole release bound, the guard's own lock wait,
 * the provisioner's delete timeout and DELETE_IN_FLIGHT_MARGIN_SECONDS (`deleteInFlightSeconds`,
 * the formula the one delete path itself uses), and finalize defers (F9, `delete_in_flight`) until
 * it has ended. A release that ended without an answer cuts it to "now + delete timeout + margin",
 * never past that deadline. 3 + 0.5 + 1 + 10 = 14.5 s here.
 */
export const QUARANTINE_SECONDS = deleteInFlightSeconds(
  seconds('SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS') * 1000,
  seconds('SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS'),
  Number(CHAOS_ENV.DATABASE_LOCK_TIMEOUT_MS),
);

/**
 * One fence-check → release → finalize chain (three receives, a few one-round-trip transactions,
 * one DELETE) on two cores shared by one chaos engine's 20 concurrent runs, its sandboxes, the
 * backend terminator and the probes: sub-second unloaded, 5 s allowed.
 */
export const CHAIN_ON_A_LOADED_MACHINE_SECONDS = 5;

/**
 * The stated convergence bound: once a run's faults stopped (and its scope went idle), its fence
 * clears within the longest timer a cleanup may have to sit out *without* faults, one backoff
 * step, and two chains. Computed from the configuration above, so that it states what the design
 * guarantees for the values the suite runs with:
 *
 * - the longest timer, whichever applies (they run side by side, they do not add up):
 *   - the delete-in-flight quarantine of an attempt that was under way when the faults stopped
 *     (a hang, a reset, a 5xx, a timeout): QUARANTINE_SECONDS = 14.5 s;
 *   - a message lost in flight (a crash, a dropped acknowledgement) reappears after its queue's
 *     visibility timeout: at most max(CHAOS_VISIBILITY_SECONDS) = 8 s;
 *   - a dead-lettered one is announced again by the sweeper within FENCE_SWEEP_AFTER + one
 *     interval = 4 + 1 s;
 * - one backoff step, CLEANUP_RETRY_MAX = 2 s: a retry of a failure that began just before the
 *   stop, the chain restart after an identity change (nextRestart), or finalize's deferred
 *   re-check that lands at most one delay after the quarantine ended (nextDeferral; the sweeper
 *   starts a new chain, and with it a new deferral chain of MAX_DEFERRALS, every 4 s, so one is
 *   always waiting);
 * - two chains: the one that clears, and one restart at phase 1 after an identity change.
 *
 *   bound = max(14.5, 8, 5) + 2 + 2 × 5 = 26.5 s
 *
 * The earlier bound (20 s = 8 + 2 + 2 × 5) predates the quarantine: finalize only waits for it
 * since F9 (migration 008), and the derivation was not revisited. Runs then measured the
 * quarantine path at 11–16 s on a quiet machine, and over 20 s once a fault-free DELETE after the
 * stop missed its 1 s timeout under load (each miss re-arms the quarantine): what the bound does
 * not cover is CPU starvation, which the suite avoids by running its engines one at a time
 * (vitest.config.ts) and by keeping its probes to one round trip inside a DELETE (lock-probe.ts).
 */
export const CONVERGENCE_BOUND_MS =
  (Math.max(
    QUARANTINE_SECONDS,
    ...Object.values(CHAOS_VISIBILITY_SECONDS),
    seconds('FENCE_SWEEP_AFTER_SECONDS') + seconds('FENCE_SWEEP_INTERVAL_SECONDS'),
  ) +
    seconds('CLEANUP_RETRY_MAX_SECONDS') +
    2 * CHAIN_ON_A_LOADED_MACHINE_SECONDS) *
  1000;

/** The consumed queues: every message sent to one must be taken off it (invariant 5). */
export const CONSUMED_QUEUES = ['run-finished', 'runtime-release.fifo', 'runtime-finalize'] as const;
