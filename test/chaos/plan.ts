/**
 * The fault catalogue and the plan of one chaos run.
 *
 * A chaos *run* is one root run's lifecycle in a runtime scope: admitted, its sandbox acquired at
 * the provisioner, maybe subagents, finished with a random terminal status, announced — and then
 * cleaned up by the real functions while the faults of its plan fire. Every fault of a run fires
 * inside its *fault window*, which starts when the root run finishes; when the window closes the
 * run's faults are lifted, and the convergence clock of the run starts (see invariants.ts).
 */

import type { Fault } from '../../infra/local/provisioner/server.ts';
import { TERMINAL_RUN_STATUSES } from '../../infra/run-statuses.ts';
import type { Rng } from './random.ts';

export const FaultKind = {
  // Provisioner (local provisioner fault table, per sandbox id, `times`-limited)
  PROVISIONER_LATENCY_BELOW_TIMEOUT: 'provisioner.latency_below_timeout',
  PROVISIONER_LATENCY_ABOVE_TIMEOUT: 'provisioner.latency_above_timeout',
  PROVISIONER_HANG: 'provisioner.hang',
  PROVISIONER_5XX: 'provisioner.5xx',
  PROVISIONER_OUTAGE: 'provisioner.outage_until_retries_exhausted',
  PROVISIONER_4XX: 'provisioner.4xx_rejected',
  PROVISIONER_RESET: 'provisioner.connection_reset',
  PROVISIONER_RESET_AFTER_DELETE: 'provisioner.reset_after_delete',
  PROVISIONER_404_ANSWER: 'provisioner.404_answer',
  PROVISIONER_409_NEWER: 'provisioner.409_newer_generation',
  PROVISIONER_409_OLDER: 'provisioner.409_older_generation',
  PROVISIONER_SLOW_BODY_BELOW_TIMEOUT: 'provisioner.slow_body_below_timeout',
  PROVISIONER_SLOW_BODY_ABOVE_TIMEOUT: 'provisioner.slow_body_above_timeout',
  PROVISIONER_OVERSIZED_BODY: 'provisioner.oversized_body',
  // Provisioner replies of contract v1.1 section 3 (issue 11.5)
  PROVISIONER_429_RETRY_AFTER: 'provisioner.429_with_retry_after',
  PROVISIONER_408: 'provisioner.408_request_timeout',
  PROVISIONER_410_GONE: 'provisioner.410_gone',
  PROVISIONER_HTML_200: 'provisioner.html_200_catch_all',
  // Database
  DB_BACKEND_TERMINATED: 'db.backend_terminated',
  DB_ADVISORY_LOCK_HELD_ABOVE_TIMEOUT: 'db.advisory_lock_held_above_lock_timeout',
  DB_ADVISORY_LOCK_HELD_BELOW_TIMEOUT: 'db.advisory_lock_held_below_lock_timeout',
  DB_ROW_LOCK_HELD_ABOVE_TIMEOUT: 'db.row_lock_held_above_lock_timeout',
  /** Every backend of the stack and of a 30-connection worker process terminated, again and again (issue 11.4). */
  DB_TERMINATION_STORM: 'db.backend_termination_storm',
  /** New connections to the database are accepted and never answered, for a while (issue 11.4). */
  DB_CONNECT_NEVER_ANSWERS: 'db.connect_never_answers',
  /**
   * The database's `default_transaction_isolation` set to REPEATABLE READ (ALTER DATABASE … SET)
   * and the stack's connections made to reconnect under it, for a while, then restored: the
   * reclaim guard once decided on a snapshot older than its lock (reclaimer bug 1).
   */
  DB_REPEATABLE_READ_DEFAULT: 'db.repeatable_read_default',
  // Process
  CRASH_BEFORE_RELEASE_PUBLISH: 'process.crash_after_fence_check_before_release_publish',
  CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH: 'process.crash_after_delete_before_finalize_publish',
  CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED: 'process.crash_after_finalize_commit_before_cleaned_publish',
  CRASH_BEFORE_ACK: 'process.crash_after_handler_before_ack',
  CRASH_MID_BATCH: 'process.crash_mid_batch',
  DUPLICATE_DELIVERY: 'process.duplicate_delivery',
  REORDERED_DELIVERY: 'process.reordered_delivery',
  ANNOUNCEMENT_LOST: 'process.run_finished_never_announced',
  // Platform
  ADMISSION_DURING_CLEANUP: 'platform.admission_attempt_during_cleanup',
  WORKDIR_CHANGED: 'platform.workdir_changed_mid_release',
  SANDBOX_RECREATED: 'platform.sandbox_recreated_new_generation',
  SANDBOX_REPLACED_NEW_ID: 'platform.sandbox_replaced_under_new_id',
  LATE_CHILD: 'platform.child_run_finishes_late',
  CONCURRENT_ROOT: 'platform.concurrent_root_run_in_scope',
  /** A new generation recorded by an upsert that leaves `released_at` alone (issue 11.3). */
  UPSERT_KEEPS_RELEASED_AT: 'platform.new_generation_upsert_keeps_released_at',
  /**
   * The same upsert applied with ordinary triggers off (`session_replication_role = replica`: a
   * logical-replication apply, a restore with triggers disabled). Migration 005's trigger cannot
   * see it; migration 008's released_sandbox_id / released_generation, compared with the row's
   * current pair, defend it without any trigger firing.
   */
  UPSERT_BYPASSING_TRIGGERS: 'platform.new_generation_upsert_bypassing_triggers_keeps_released_at',
  // Operator
  /**
   * `ops force-clear` while the run's release DELETE is in flight, the scope served by the
   * platform's provisioner (POST reuses the live sandbox, DELETE ignores the generation), and a
   * new run admitted at once if the clear went through (issue 11.1).
   */
  FORCE_CLEAR_DURING_RELEASE: 'operator.force_clear_during_in_flight_release',
  // Reclaimer (issue 21: the faults that would have found the reclaimer's bugs)
  /**
   * A leak of the run's scope (its sandbox id created again and never recorded), whose reclaim
   * DELETE the provisioner answers 202 and carries out later; while it is pending the platform
   * tries to admit a run into the scope (reclaimer bug 2: the quarantine ended at the answer).
   */
  RECLAIM_DELETE_202_CARRIED_OUT_LATER: 'reclaimer.delete_answered_202_carried_out_later',
  /** The same, answered 200 `{"status":"deleting"}`. */
  RECLAIM_DELETE_200_DELETING_CARRIED_OUT_LATER: 'reclaimer.delete_answered_200_deleting_carried_out_later',
  /**
   * The statement after a reclaim DELETE (the one ending the attempt's records) fails: its backend
   * terminated while it waits for a row held for the purpose; then the reclaimed (sandbox,
   * generation) is recorded, which the tombstone must refuse (reclaimer bug 3, invariant K).
   */
  RECLAIM_STATEMENT_AFTER_DELETE_FAILS: 'reclaimer.statement_after_delete_fails',
  /**
   * A quiet night: every run ended, only leaks live, the brakes at the product's defaults, which
   * refuse such a listing on their own (reclaimer bug 6: never reclaimed); invariant Q.
   */
  RECLAIM_QUIET_FLEET: 'reclaimer.quiet_fleet',
  /**
   * A deterministic id (derived from the scope, listed without a generation) reclaimed, then
   * recorded for the conversation's next container: accepted within the delete window plus margin,
   * not a grace later (reclaimer bug 7); invariant N.
   */
  RECLAIM_DETERMINISTIC_ID_REUSED: 'reclaimer.deterministic_id_reused_after_reclaim',
  // Input
  HOSTILE_MESSAGE: 'input.hostile_message',
  /**
   * Well-formed release commands sent straight to the release queue that are not the cleanup the
   * database knows: wrong uid, scope, sandbox or generation, a run not terminal, a subagent run
   * (issue 11.2).
   */
  FORGED_RELEASE: 'input.forged_or_mismatched_release',
} as const;
export type FaultKind = (typeof FaultKind)[keyof typeof FaultKind];

/**
 * Provisioner answers that assert something false (the sandbox is gone while it is not). The
 * contract makes the cleanup trust them, so the fence is cleared and the sandbox stays: such a
 * scope is retired (never admits a run again) and its leftover sandbox is an *expected* leak,
 * counted apart from real ones.
 */
export const LYING_PROVISIONER_FAULTS: ReadonlySet<FaultKind> = new Set([
  FaultKind.PROVISIONER_404_ANSWER,
  FaultKind.PROVISIONER_409_NEWER,
]);

/** The timeouts the faults are placed around (milliseconds), from the chaos configuration. */
export interface Timeouts {
  provisionerDeleteMs: number;
  databaseLockMs: number;
  /** A release's whole budget: past it a retried release is certain to have given up. */
  runtimeCleanupMs: number;
}

export type ConsumedQueue = 'run-finished' | 'runtime-release.fifo' | 'runtime-finalize';
export type ConsumerFunction = 'fence-check' | 'release' | 'finalize';
/** One of TERMINAL_RUN_STATUSES, read from the database's definition (infra/run-statuses.ts). */
export type TerminalStatus = string;

export interface ProvisionerFaultPlan {
  kind: FaultKind;
  /** Without `times`, it holds until the fault window closes. */
  fault: Fault;
}

export interface RunPlan {
  index: number;
  /**
   * The kind the coverage cycle forces on this run, if any: the run does not lift its faults
   * until that one has fired (see run-driver.ts), so the cycle covers the catalogue by
   * construction, however slow the machine.
   */
  forced: FaultKind | undefined;
  /** Prefer an idle scope that already had runs (admission gating, generation bumps). */
  reuseScope: boolean;
  terminalStatus: TerminalStatus;
  workMs: number;
  /** Subagents: `lateByMs` null finishes before the root, else that long after it. */
  children: Array<{ lateByMs: number | null }>;
  concurrentRoot: boolean;
  announce: boolean;
  faultWindowMs: number;
  provisioner: ProvisionerFaultPlan[];
  /** Crash points, each armed once for this run. */
  crashes: Array<
    | typeof FaultKind.CRASH_BEFORE_RELEASE_PUBLISH
    | typeof FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH
    | typeof FaultKind.CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED
  >;
  /** One dropped acknowledgement per entry, for a message of this run on that function. */
  droppedAcks: ConsumerFunction[];
  locks: Array<{ kind: FaultKind; atMs: number; holdMs: number }>;
  admissionAttemptsAtMs: number[];
  workdirChangeAtMs: number | null;
  recreateSandbox: { atMs: number; newId: boolean } | null;
  replays: Array<{ queue: ConsumedQueue; delayMs: number }>;
  hostileMessages: number;
  forceClearDuringRelease: boolean;
  forgedReleases: boolean;
  upsertKeepsReleasedAt: boolean;
  upsertBypassingTriggers: boolean;
  /** A termination storm, or a period of connects that never answer, starting `atMs` into the window. */
  terminationStorm: { atMs: number; ms: number } | null;
  connectsNeverAnswer: { atMs: number; ms: number } | null;
  /** The database's default isolation REPEATABLE READ from `atMs` into the window, for `ms`. */
  repeatableRead: { atMs: number; ms: number } | null;
  /** A leak of the scope whose reclaim DELETE is answered `status` and carried out later. */
  reclaimDeletedLater: { kind: FaultKind; status: 202 | 200; deleteAfterMs: number } | null;
  /** A leak whose reclaim DELETE's next statement fails, then a late record of it. */
  statementAfterReclaimDeleteFails: boolean;
  /** A quiet window: the other runs held out, only leaks live (stack-wide: keep it rare). */
  quietFleet: boolean;
  /** The scope's id reclaimed as a deterministic one, then recorded for its next container. */
  deterministicIdReused: boolean;
}

/** How often each family of faults is drawn; the CLI's profile and the fixed-seed test's differ. */
export interface FaultMix {
  provisionerFault: number;
  outage: number;
  crash: number;
  droppedAck: number;
  advisoryLock: number;
  rowLock: number;
  admissionAttempts: number;
  workdirChange: number;
  recreateSandbox: number;
  children: number;
  concurrentRoot: number;
  announcementLost: number;
  replays: number;
  hostile: number;
  forceClearDuringRelease: number;
  forgedRelease: number;
  upsertKeepsReleasedAt: number;
  /** Stack-wide episodes (every concurrent run is hit): drawn per run, so keep them rare. */
  terminationStorm: number;
  connectNeverAnswers: number;
  repeatableRead: number;
  /** The reclaimer's faults (played only when the reclaimer runs beside the protocol). */
  reclaimFault: number;
  /** Upper bound of a run's fault window. */
  maxFaultWindowMs: number;
  /**
   * The window of a run the coverage cycle forces a kind on; drawn from 2 s up to
   * maxFaultWindowMs when unset. A forced fault fires however short it is (the run waits for the
   * fault's trigger point): 0 shows that coverage does not depend on timing.
   */
  forcedWindowMs?: number;
}

export const DEFAULT_MIX: FaultMix = {
  provisionerFault: 0.75,
  outage: 0.03,
  crash: 0.08,
  droppedAck: 0.1,
  advisoryLock: 0.1,
  rowLock: 0.05,
  admissionAttempts: 0.3,
  workdirChange: 0.06,
  recreateSandbox: 0.08,
  children: 0.2,
  concurrentRoot: 0.05,
  announcementLost: 0.03,
  replays: 0.25,
  hostile: 0.03,
  forceClearDuringRelease: 0.03,
  forgedRelease: 0.04,
  upsertKeepsReleasedAt: 0.04,
  terminationStorm: 0.008,
  connectNeverAnswers: 0.008,
  repeatableRead: 0.008,
  reclaimFault: 0.02,
  maxFaultWindowMs: 4_000,
};

const TERMINAL_STATUSES: readonly TerminalStatus[] = TERMINAL_RUN_STATUSES;

/** Provisioner faults that end by themselves (`times`), drawn for most runs. */
const TRANSIENT_PROVISIONER_FAULTS = [
  FaultKind.PROVISIONER_LATENCY_BELOW_TIMEOUT,
  FaultKind.PROVISIONER_LATENCY_ABOVE_TIMEOUT,
  FaultKind.PROVISIONER_HANG,
  FaultKind.PROVISIONER_5XX,
  FaultKind.PROVISIONER_4XX,
  FaultKind.PROVISIONER_RESET,
  FaultKind.PROVISIONER_RESET_AFTER_DELETE,
  FaultKind.PROVISIONER_404_ANSWER,
  FaultKind.PROVISIONER_409_NEWER,
  FaultKind.PROVISIONER_409_OLDER,
  FaultKind.PROVISIONER_SLOW_BODY_BELOW_TIMEOUT,
  FaultKind.PROVISIONER_SLOW_BODY_ABOVE_TIMEOUT,
  FaultKind.PROVISIONER_OVERSIZED_BODY,
  FaultKind.PROVISIONER_429_RETRY_AFTER,
  FaultKind.PROVISIONER_408,
  FaultKind.PROVISIONER_410_GONE,
  FaultKind.PROVISIONER_HTML_200,
] as const;

/** The kinds that live in the provisioner's fault table: they fire on a DELETE of the sandbox. */
export const PROVISIONER_FAULT_KINDS: ReadonlySet<FaultKind> = new Set([
  ...TRANSIENT_PROVISIONER_FAULTS,
  FaultKind.PROVISIONER_OUTAGE,
]);

/**
 * The faults production showed the suite never generated (issue 11): each forced by the coverage
 * cycle, each aimed at one fix (test/chaos/results/fix-reverted.md shows the suite finding each
 * one with its fix reverted). The provisioner replies among them are in the transient list above.
 */
export const PRODUCTION_FAULT_KINDS: readonly FaultKind[] = [
  FaultKind.FORCE_CLEAR_DURING_RELEASE,
  FaultKind.FORGED_RELEASE,
  FaultKind.UPSERT_KEEPS_RELEASED_AT,
  FaultKind.UPSERT_BYPASSING_TRIGGERS,
  FaultKind.DB_TERMINATION_STORM,
  FaultKind.DB_CONNECT_NEVER_ANSWERS,
];

/**
 * The faults that would have found the reclaimer's bugs (issue 21, reclaim-faults.ts): each needs
 * the reclaimer running beside the protocol (`reclaim` in ChaosOptions); a run forced on one
 * without it is a harness error.
 */
export const RECLAIMER_FAULT_KINDS: readonly FaultKind[] = [
  FaultKind.RECLAIM_DELETE_202_CARRIED_OUT_LATER,
  FaultKind.RECLAIM_DELETE_200_DELETING_CARRIED_OUT_LATER,
  FaultKind.DB_REPEATABLE_READ_DEFAULT,
  FaultKind.RECLAIM_STATEMENT_AFTER_DELETE_FAILS,
  FaultKind.RECLAIM_QUIET_FLEET,
  FaultKind.RECLAIM_DETERMINISTIC_ID_REUSED,
];

/**
 * Kinds the suite can play (`--kinds`) that the current code does not defend against: kept out of
 * the coverage cycle and the random mix so that "0 violations" stays a statement about the
 * defended catalogue, and listed in test/chaos/README.md with what they find.
 */
export const UNDEFENDED_FAULT_KINDS: readonly FaultKind[] = [];

/**
 * The kinds a small run cycles through first, one per run, so that even a few dozen runs cover
 * every fault (the fixed-seed test asserts it); draws on top of that stay random.
 */
export const COVERAGE_CYCLE: readonly FaultKind[] = [
  ...TRANSIENT_PROVISIONER_FAULTS,
  FaultKind.PROVISIONER_OUTAGE,
  FaultKind.DB_ADVISORY_LOCK_HELD_ABOVE_TIMEOUT,
  FaultKind.DB_ADVISORY_LOCK_HELD_BELOW_TIMEOUT,
  FaultKind.DB_ROW_LOCK_HELD_ABOVE_TIMEOUT,
  FaultKind.CRASH_BEFORE_RELEASE_PUBLISH,
  FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH,
  FaultKind.CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED,
  FaultKind.CRASH_BEFORE_ACK,
  FaultKind.DUPLICATE_DELIVERY,
  FaultKind.ANNOUNCEMENT_LOST,
  FaultKind.ADMISSION_DURING_CLEANUP,
  FaultKind.WORKDIR_CHANGED,
  FaultKind.SANDBOX_RECREATED,
  FaultKind.SANDBOX_REPLACED_NEW_ID,
  FaultKind.LATE_CHILD,
  FaultKind.CONCURRENT_ROOT,
  FaultKind.HOSTILE_MESSAGE,
  ...PRODUCTION_FAULT_KINDS,
  ...RECLAIMER_FAULT_KINDS,
];

/** The provisioner fault of a kind, placed below or above the delete timeout as its name says. */
export function provisionerFault(kind: FaultKind, rng: Rng, timeouts: Timeouts, generation: number): Fault {
  const deleteMs = timeouts.provisionerDeleteMs;
  switch (kind) {
    case FaultKind.PROVISIONER_LATENCY_BELOW_TIMEOUT:
      return {
        latencyMs: rng.int(Math.round(deleteMs * 0.1), Math.round(deleteMs * 0.7)),
        times: rng.int(1, 3),
      };
    case FaultKind.PROVISIONER_LATENCY_ABOVE_TIMEOUT:
      return { latencyMs: rng.int(Math.round(deleteMs * 1.2), deleteMs * 3), times: rng.int(1, 2) };
    case FaultKind.PROVISIONER_HANG:
      return { hang: true, times: rng.int(1, 2) };
    case FaultKind.PROVISIONER_5XX:
      return { status: rng.pick([500, 502, 503, 504]), times: rng.int(1, 4) };
    case FaultKind.PROVISIONER_OUTAGE:
      // No `times`: every delete fails until the window closes, long enough to exhaust the
      // retries (maxReceiveCount) and dead-letter the release; the sweeper must pick it up.
      return { status: 503 };
    case FaultKind.PROVISIONER_4XX:
      return { status: rng.pick([400, 403, 422]), times: 1 };
    case FaultKind.PROVISIONER_RESET:
      // Two resets in a row defeat the client's one immediate retry.
      return { reset: true, times: rng.int(1, 3) };
    case FaultKind.PROVISIONER_RESET_AFTER_DELETE:
      return { reset: true, afterHandling: true, times: 1 };
    case FaultKind.PROVISIONER_404_ANSWER:
      return { status: 404, times: 1 };
    case FaultKind.PROVISIONER_409_NEWER:
      return { conflictGeneration: generation + rng.int(1, 3), times: 1 };
    case FaultKind.PROVISIONER_409_OLDER:
      return { conflictGeneration: Math.max(0, generation - rng.int(1, 2)), times: 1 };
    case FaultKind.PROVISIONER_SLOW_BODY_BELOW_TIMEOUT:
      return {
        slowBodyMs: rng.int(Math.round(deleteMs * 0.1), Math.round(deleteMs * 0.6)),
        times: rng.int(1, 2),
      };
    case FaultKind.PROVISIONER_SLOW_BODY_ABOVE_TIMEOUT:
      return { slowBodyMs: rng.int(Math.round(deleteMs * 1.3), deleteMs * 2), times: 1 };
    case FaultKind.PROVISIONER_OVERSIZED_BODY:
      return { oversizedBodyBytes: rng.int(100 * 1024, 4 * 1024 * 1024), times: rng.int(1, 2) };
    case FaultKind.PROVISIONER_429_RETRY_AFTER:
      // Retryable, and not before the time asked (within the backoff cap).
      return {
        status: 429,
        retryAfter: { seconds: rng.int(1, 2), as: rng.pick(['delta-seconds', 'http-date'] as const) },
        times: rng.int(1, 2),
      };
    case FaultKind.PROVISIONER_408:
      return { status: 408, times: rng.int(1, 2) };
    case FaultKind.PROVISIONER_410_GONE:
      // Deleted for real, answered 410: the generation is gone, the fence may clear.
      return { gone: true, times: 1 };
    case FaultKind.PROVISIONER_HTML_200:
      // A catch-all server at a wrong URL: 200 with a page, the sandbox untouched. Not a confirmation.
      return {
        status: 200,
        contentType: 'text/html; charset=utf-8',
        body: '<!doctype html><html><head><title>Welcome</title></head><body>It works!</body></html>',
        times: 1,
      };
    default:
      throw new Error(`${kind} is not a provisioner fault`);
  }
}

/**
 * The reclaim DELETE answered early and carried out later: after the provisioner's own delete time
 * at least (the answer is long gone), within the residual quarantine the product keeps for a
 * DELETE that may still act (residualDeleteSeconds: that time plus a margin).
 */
function drawDeletedLater(
  rng: Rng,
  mix: FaultMix,
  timeouts: Timeouts,
  forced: FaultKind | undefined,
  focused: boolean,
): RunPlan['reclaimDeletedLater'] {
  const variants = [
    [FaultKind.RECLAIM_DELETE_202_CARRIED_OUT_LATER, 202],
    [FaultKind.RECLAIM_DELETE_200_DELETING_CARRIED_OUT_LATER, 200],
  ] as const;
  const chosen = focused
    ? variants.find(([kind]) => kind === forced)
    : rng.chance(mix.reclaimFault / 2)
      ? rng.pick(variants)
      : undefined;
  if (!chosen) return null;
  const deleteMs = timeouts.provisionerDeleteMs;
  return { kind: chosen[0], status: chosen[1], deleteAfterMs: rng.int(deleteMs, deleteMs * 3) };
}

/**
 * Draws the plan of run `index`. Provisioner faults are kept as kinds here; their parameters that
 * depend on the sandbox (the generation a 409 names) are filled in once it exists.
 */
export function drawPlan(
  index: number,
  rng: Rng,
  mix: FaultMix,
  timeouts: Timeouts,
  forced: FaultKind | undefined,
): RunPlan & { provisionerKinds: FaultKind[] } {
  // A forced run (the coverage cycle) gets its one kind and nothing else; it keeps its faults up
  // until that kind fired (run-driver.ts), so every kind happens in a few dozen runs.
  const focused = forced !== undefined;
  const window = focused
    ? (mix.forcedWindowMs ?? rng.int(2_000, Math.max(2_000, mix.maxFaultWindowMs)))
    : rng.int(0, mix.maxFaultWindowMs);
  const at = () => rng.int(0, window);
  const has = (kind: FaultKind, probability: number) =>
    forced === kind || (!focused && rng.chance(probability));

  const provisionerKinds: FaultKind[] = [];
  if (forced && (TRANSIENT_PROVISIONER_FAULTS as readonly FaultKind[]).includes(forced)) {
    provisionerKinds.push(forced);
  }
  if (!focused && rng.chance(mix.provisionerFault)) {
    const count = rng.chance(0.3) ? 2 : 1;
    for (let i = 0; i < count; i += 1) provisionerKinds.push(rng.pick(TRANSIENT_PROVISIONER_FAULTS));
  }
  if (has(FaultKind.PROVISIONER_OUTAGE, mix.outage)) provisionerKinds.push(FaultKind.PROVISIONER_OUTAGE);
  const outage = provisionerKinds.includes(FaultKind.PROVISIONER_OUTAGE);

  const crashes: RunPlan['crashes'] = [];
  for (const kind of [
    FaultKind.CRASH_BEFORE_RELEASE_PUBLISH,
    FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH,
    FaultKind.CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED,
  ] as const) {
    if (has(kind, mix.crash)) crashes.push(kind);
  }
  const droppedAcks: ConsumerFunction[] = [];
  if (forced === FaultKind.CRASH_BEFORE_ACK) droppedAcks.push('fence-check', 'release', 'finalize');
  else if (has(FaultKind.CRASH_BEFORE_ACK, mix.droppedAck)) {
    const count = rng.int(1, 2);
    for (let i = 0; i < count; i += 1)
      droppedAcks.push(rng.pick(['fence-check', 'release', 'finalize'] as const));
  }

  const locks: RunPlan['locks'] = [];
  const lockMs = timeouts.databaseLockMs;
  if (has(FaultKind.DB_ADVISORY_LOCK_HELD_ABOVE_TIMEOUT, mix.advisoryLock)) {
    locks.push({
      kind: FaultKind.DB_ADVISORY_LOCK_HELD_ABOVE_TIMEOUT,
      atMs: at(),
      holdMs: rng.int(lockMs + 100, lockMs * 3),
    });
  }
  if (has(FaultKind.DB_ADVISORY_LOCK_HELD_BELOW_TIMEOUT, mix.advisoryLock / 2)) {
    locks.push({
      kind: FaultKind.DB_ADVISORY_LOCK_HELD_BELOW_TIMEOUT,
      atMs: at(),
      holdMs: rng.int(Math.round(lockMs * 0.2), Math.round(lockMs * 0.7)),
    });
  }
  if (has(FaultKind.DB_ROW_LOCK_HELD_ABOVE_TIMEOUT, mix.rowLock)) {
    locks.push({
      kind: FaultKind.DB_ROW_LOCK_HELD_ABOVE_TIMEOUT,
      atMs: at(),
      holdMs: rng.int(lockMs + 100, lockMs * 3),
    });
  }

  const admissionAttemptsAtMs: number[] = [];
  if (has(FaultKind.ADMISSION_DURING_CLEANUP, mix.admissionAttempts)) {
    // The first attempt comes right after the run finished, while its fence is certainly up.
    const count = rng.int(1, 3);
    for (let i = 0; i < count; i += 1) admissionAttemptsAtMs.push(i === 0 ? 0 : at());
  }

  const children: RunPlan['children'] = [];
  if (has(FaultKind.LATE_CHILD, mix.children)) {
    const count = rng.int(1, 3);
    for (let i = 0; i < count; i += 1) {
      const late = forced === FaultKind.LATE_CHILD ? i === 0 || rng.chance(0.5) : rng.chance(0.5);
      children.push({ lateByMs: late ? rng.int(200, Math.max(300, window)) : null });
    }
  }

  const replays: RunPlan['replays'] = [];
  if (has(FaultKind.DUPLICATE_DELIVERY, mix.replays)) {
    const count = rng.int(1, 3);
    for (let i = 0; i < count; i += 1) {
      replays.push({
        queue: rng.pick(['run-finished', 'runtime-release.fifo', 'runtime-finalize'] as const),
        delayMs: rng.int(0, window + 6_000),
      });
    }
  }

  const recreate = has(FaultKind.SANDBOX_RECREATED, mix.recreateSandbox / 2)
    ? { atMs: at(), newId: false }
    : has(FaultKind.SANDBOX_REPLACED_NEW_ID, mix.recreateSandbox / 2)
      ? { atMs: at(), newId: true }
      : null;

  return {
    index,
    forced,
    reuseScope: rng.chance(0.5),
    terminalStatus: rng.pick(TERMINAL_STATUSES),
    workMs: rng.int(0, 300),
    children,
    concurrentRoot: has(FaultKind.CONCURRENT_ROOT, mix.concurrentRoot),
    announce: !has(FaultKind.ANNOUNCEMENT_LOST, mix.announcementLost),
    // An outage must outlast maxReceiveCount receives (about 8 × 1–2 s of backoff) to exhaust them;
    // a re-provisioning needs time to catch the moment between the delete and the finalize.
    faultWindowMs: Math.max(window, outage ? 14_000 : 0, recreate ? 2_500 : 0),
    provisioner: [],
    provisionerKinds,
    crashes,
    droppedAcks,
    locks,
    admissionAttemptsAtMs,
    workdirChangeAtMs: has(FaultKind.WORKDIR_CHANGED, mix.workdirChange) ? at() : null,
    recreateSandbox: recreate,
    replays,
    hostileMessages: has(FaultKind.HOSTILE_MESSAGE, mix.hostile) ? rng.int(1, 3) : 0,
    forceClearDuringRelease: has(FaultKind.FORCE_CLEAR_DURING_RELEASE, mix.forceClearDuringRelease),
    forgedReleases: has(FaultKind.FORGED_RELEASE, mix.forgedRelease),
    upsertKeepsReleasedAt: has(FaultKind.UPSERT_KEEPS_RELEASED_AT, mix.upsertKeepsReleasedAt),
    upsertBypassingTriggers: has(FaultKind.UPSERT_BYPASSING_TRIGGERS, mix.upsertKeepsReleasedAt / 2),
    terminationStorm: has(FaultKind.DB_TERMINATION_STORM, mix.terminationStorm)
      ? { atMs: at(), ms: rng.int(1_500, 3_000) }
      : null,
    connectsNeverAnswer: has(FaultKind.DB_CONNECT_NEVER_ANSWERS, mix.connectNeverAnswers)
      ? { atMs: at(), ms: rng.int(1_000, 2_500) }
      : null,
    repeatableRead: has(FaultKind.DB_REPEATABLE_READ_DEFAULT, mix.repeatableRead)
      ? { atMs: at(), ms: rng.int(2_000, 4_000) }
      : null,
    reclaimDeletedLater: drawDeletedLater(rng, mix, timeouts, forced, focused),
    statementAfterReclaimDeleteFails: has(
      FaultKind.RECLAIM_STATEMENT_AFTER_DELETE_FAILS,
      mix.reclaimFault / 2,
    ),
    // Stack-wide (every other run held out for seconds): rarer still.
    quietFleet: has(FaultKind.RECLAIM_QUIET_FLEET, mix.reclaimFault / 10),
    deterministicIdReused: has(FaultKind.RECLAIM_DETERMINISTIC_ID_REUSED, mix.reclaimFault / 2),
  };
}
