/**
 * The faults that would have found the reclaimer's bugs (issue 21), played inside a run's fault
 * window while the reclaimer runs beside the fence protocol (reclaim-chaos.ts). Each is modelled as
 * the outside world would do it — a provisioner, the platform, the database's configuration:
 *
 * - RECLAIM_DELETE_202_CARRIED_OUT_LATER / …_200_DELETING_…: once the run's cleanup is done, the
 *   scope's next admission crashes between POST and record (its sandbox id created again, never
 *   recorded): a leak of the scope. The provisioner answers the reclaimer's DELETE of it with 202
 *   (or 200 `{"status":"deleting"}`) and deletes the container only later. Right after the answer
 *   the platform admits a run into the scope the documented way: if admission lets it, the POST
 *   reuses the live container and the run works in it until the late delete lands. Invariant GC
 *   judges that delete at the moment it is carried out (reclaim-chaos.ts): reclaimer bug 2 ended
 *   the quarantine at the answer, and this run lost its container.
 */
import { randomUUID } from 'node:crypto';
import type { Database } from '../../functions/adapters/database.ts';
import type { ReclaimerResult } from '../../functions/reclaimer/handler.ts';
import type { AdmittedRun } from '../../infra/local/platform.ts';
import { type AuditEntry, PROVISIONER_MODE } from '../../infra/local/provisioner/types.ts';
import { preciseNow } from './clock.ts';
import type { RunPlan } from './plan.ts';
import type { ScopeState } from './platform-ops.ts';
import type { ProductionFaultContext } from './production-faults.ts';
import { HARNESS_STATEMENT_TIMEOUT_MS } from './settings.ts';

/** What the reclaimer's faults leave for the final checks (reclaim-checks.ts). */
export interface ReclaimFaultState {
  lateRecords: LateRecordAttempt[];
  quietWindows: QuietWindow[];
  reusedIds: ReusedIdAttempt[];
}

export function newReclaimFaultState(): ReclaimFaultState {
  return { lateRecords: [], quietWindows: [], reusedIds: [] };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
const left = (deadlineMs: number) => Math.max(0, deadlineMs - preciseNow());

/** What became of one leak whose reclaim DELETE was answered early. */
export interface DeletedLaterAttempt {
  /** The platform tried to admit a run while the delete was still pending at the provisioner. */
  admittedWhilePending: boolean | undefined;
  /** The run admitted (a bug: it was handed the container being deleted), if any. */
  admittedRunId: string | undefined;
  /** The provisioner carried the delete out. */
  carriedOut: boolean;
}

/**
 * After the run's fence cleared: a leak of the scope, its reclaim DELETE answered early and carried
 * out later, and an admission into the scope while it is pending. Repeated until that happened
 * once (an admission that came only after the late delete proves nothing) or the deadline passed.
 * Returns whether it happened.
 */
export async function admitDuringDeleteCarriedOutLater(
  ctx: ProductionFaultContext,
  scope: ScopeState,
  root: AdmittedRun,
  roots: AdmittedRun[],
  fault: NonNullable<RunPlan['reclaimDeletedLater']>,
  deadlineMs: number,
): Promise<boolean> {
  if (!(await ctx.fences.waitCleared([root.runId], left(deadlineMs)))) return false;
  while (preciseNow() < deadlineMs) {
    const attempt = await leakOnce(ctx, scope, root.sandboxId, roots, fault, deadlineMs);
    if (attempt?.admittedWhilePending && attempt.carriedOut) return true;
  }
  return false;
}

async function leakOnce(
  ctx: ProductionFaultContext,
  scope: ScopeState,
  sandboxId: string,
  roots: AdmittedRun[],
  fault: NonNullable<RunPlan['reclaimDeletedLater']>,
  deadlineMs: number,
): Promise<DeletedLaterAttempt | undefined> {
  const { provisioner } = ctx;
  // A sandbox of the scope still live (a lost delete of another fault) would be this leak.
  if (provisioner.sandbox(sandboxId) !== undefined) {
    await sleep(200);
    return undefined;
  }
  const lastSeq = Math.max(0, ...provisioner.audit().map((entry) => entry.seq));
  provisioner.setFault(sandboxId, {
    status: fault.status,
    body: '{"status":"deleting"}',
    contentType: 'application/json',
    deleteAfterMs: fault.deleteAfterMs,
    times: 1,
  });
  try {
    // The scope's next admission crashed between the POST and the record: the id the platform
    // derives for the scope, created again, recorded nowhere.
    const response = await createSandbox(ctx.provisionerUrl, {
      sandboxId,
      threadId: scope.ref.threadId,
      uid: scope.ref.uid,
    });
    if (!response.created) {
      throw new Error(`the provisioner refused the scope's leak: ${response.status}`);
    }
    let arrived: AuditEntry;
    try {
      arrived = await provisioner.waitForRequest(
        (entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId && entry.seq > lastSeq,
        left(deadlineMs),
      );
    } catch {
      return undefined;
    }
    const entryOf = () => provisioner.audit().find((entry) => entry.seq === arrived.seq);
    while (entryOf()?.outcome === 'pending' && preciseNow() < deadlineMs) await sleep(10);
    const answered = entryOf();
    if (!answered?.fault?.endsWith('+deleted-later')) return undefined;
    // The platform admits the scope's next run as soon as admission lets it.
    const attemptedAtMs = preciseNow();
    const next = await ctx.platform.admitRootRun(scope.ref);
    const carriedOutAt = () => entryOf()?.deletedAt;
    if (next) {
      ctx.scopes.noteSandbox(scope, next.sandboxId);
      roots.push(next);
    }
    // The run (if any) works in the container it was handed until the late delete is over.
    const settleBy = preciseNow() + fault.deleteAfterMs + 5_000;
    while (
      carriedOutAt() === undefined &&
      provisioner.sandbox(sandboxId) !== undefined &&
      preciseNow() < settleBy
    ) {
      await sleep(50);
    }
    if (next) await ctx.platform.finishRun(next.runId, 'completed');
    const deletedAt = carriedOutAt();
    return {
      admittedWhilePending: deletedAt === undefined ? undefined : attemptedAtMs < deletedAt,
      admittedRunId: next?.runId,
      carriedOut: deletedAt !== undefined,
    };
  } finally {
    provisioner.clearFaults(sandboxId);
  }
}

// --- the statement after a reclaim DELETE fails ------------------------------------------------

/** A record of a reclaimed (sandbox, generation) tried after the reclaim DELETE deleted it. */
export interface LateRecordAttempt {
  sandboxId: string;
  generation: number;
  /**
   * `while-in-flight`: right after the DELETE, the guard's in-flight record still up;
   * `after-in-flight`: after it, within the grace, where only the tombstone refuses.
   */
  phase: 'while-in-flight' | 'after-in-flight';
  /** How the statement that ends the reclaim attempt failed: 'terminated' or 'lock_timeout'. */
  settleFailedBy: string;
  /** From the DELETE's answer to the record attempt. */
  msAfterDelete: number;
  /** The record's refusal (SQLSTATE and message), or null when it was accepted. */
  refusal: { code: string | undefined; message: string } | null;
}

/** The stack's backend running the statement that ends a reclaim attempt, if one is at it. */
const END_RECLAIM_BACKEND = `
  SELECT pid FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = $1::text AND state = 'active'
    AND query LIKE '%runtime_cleanup_end_reclaim(%' AND pid <> pg_backend_pid()
  LIMIT 1`;
const TERMINATE = 'SELECT pg_terminate_backend($1::int) AS terminated';
/** The row the end statement must write: the sighting the guard stamped with its in-flight record. */
const LOCK_SIGHTING = 'SELECT 1 FROM runtime_reclaim_sightings WHERE sandbox_id = $1::text FOR UPDATE';
const IN_FLIGHT_LEFT_MS = `
  SELECT greatest(0, extract(epoch FROM reclaim_in_flight_until - clock_timestamp()) * 1000)::float8 AS left_ms
  FROM runtime_reclaim_sightings WHERE sandbox_id = $1::text`;
const SIGHTING_IN_FLIGHT = `
  SELECT reclaim_in_flight_token IS NOT NULL AS in_flight FROM runtime_reclaim_sightings WHERE sandbox_id = $1::text`;

export interface SettleFailureDeps {
  ctx: ProductionFaultContext;
  /** Holds the sighting's row lock for the length of the fault. */
  lockerDb: Database;
  /** Looks for the stack's backend and terminates it. */
  adminDb: Database;
  stackApplicationName: string;
  lockTimeoutMs: number;
  /** The reclaimer's grace: the tombstone refuses the deleted generation that long after the guard. */
  graceMs: number;
}

/**
 * A leak injected for the fault; its reclaim DELETE is carried out (a confirmation), and the
 * statement after it — the one that ends the attempt's records — fails: the sighting's row is held
 * so the statement waits, and its backend is terminated while it does (or, missed, it fails on its
 * lock timeout). Then the platform records the reclaimed (sandbox, generation), as one handed the
 * deleted container by a POST during the DELETE would: the tombstone laid before the DELETE must
 * refuse it (invariant K). Returns the attempt, or undefined if the moment never came.
 */
export async function failStatementAfterReclaimDelete(
  deps: SettleFailureDeps,
  scope: ScopeState,
  deadlineMs: number,
): Promise<LateRecordAttempt[] | undefined> {
  const { ctx, lockerDb, adminDb } = deps;
  const { provisioner } = ctx;
  const sandboxId = `sbx-leaked-late-${randomUUID().slice(0, 12)}`;
  // Held a moment at the provisioner, so the sighting's row is locked before the answer.
  provisioner.setFault(sandboxId, { latencyMs: 300, times: 1 });
  try {
    const response = await createSandbox(ctx.provisionerUrl, {
      sandboxId,
      threadId: scope.ref.threadId,
      uid: scope.ref.uid,
    });
    if (!response.created) {
      throw new Error(`the provisioner refused the leak: ${response.status}`);
    }
    let arrived: AuditEntry;
    try {
      arrived = await provisioner.waitForRequest(
        (entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId,
        left(deadlineMs),
      );
    } catch {
      return undefined;
    }
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let locked!: () => void;
    const lockHeld = new Promise<void>((resolve) => {
      locked = resolve;
    });
    const holding = lockerDb
      .withTransaction(async (tx) => {
        await tx.query(LOCK_SIGHTING, [sandboxId]);
        locked();
        await released;
      })
      .catch(() => locked());
    let settleFailedBy: string | undefined;
    try {
      await lockHeld;
      const entryOf = () => provisioner.audit().find((entry) => entry.seq === arrived.seq);
      while (entryOf()?.outcome === 'pending' && preciseNow() < deadlineMs) await sleep(10);
      const answeredAtMs = entryOf()?.endedAt ?? preciseNow();
      // The end statement waits for the row; catch it there (it gives up on its lock timeout).
      while (settleFailedBy === undefined && preciseNow() < answeredAtMs + deps.lockTimeoutMs + 2_000) {
        const { rows } = await adminDb.query<{ pid: number }>(END_RECLAIM_BACKEND, [
          deps.stackApplicationName,
        ]);
        if (rows[0]) {
          const result = await adminDb.query<{ terminated: boolean }>(TERMINATE, [rows[0].pid]);
          if (result.rows[0]?.terminated) settleFailedBy = 'terminated';
        } else await sleep(5);
      }
    } finally {
      release();
      await holding;
    }
    const deleted = provisioner.audit().find((entry) => entry.seq === arrived.seq);
    if (deleted?.deletedGeneration === undefined) return undefined;
    // Not caught (the statement gave up on its lock first) — it failed all the same, if it left
    // the guard's in-flight record behind.
    if (settleFailedBy === undefined) {
      const { rows } = await adminDb.query<{ in_flight: boolean }>(SIGHTING_IN_FLIGHT, [sandboxId]);
      if (!rows[0]?.in_flight) return undefined;
      settleFailedBy = 'lock_timeout';
    }
    ctx.scopes.noteSandbox(scope, sandboxId);
    const generation = deleted.deletedGeneration;
    const failedBy = settleFailedBy;
    const lateRecord = async (phase: LateRecordAttempt['phase']): Promise<LateRecordAttempt> => {
      const recordedAtMs = preciseNow();
      let refusal: LateRecordAttempt['refusal'] = null;
      try {
        await ctx.platform.recordSandbox(scope.ref, { sandboxId, generation });
      } catch (error) {
        refusal = { code: (error as { code?: string }).code, message: (error as Error).message };
      }
      const msAfterDelete = Math.round(recordedAtMs - (deleted.deletedAt ?? recordedAtMs));
      return { sandboxId, generation, phase, settleFailedBy: failedBy, msAfterDelete, refusal };
    };
    const attempts = [await lateRecord('while-in-flight')];
    // Once the guard's in-flight record is over, only the tombstone (laid by the guard, the listing
    // having named the generation) refuses, until a grace after the guard: with a grace longer than
    // the hold (`--reclaim-grace`), that moment exists, and a record then must still be refused.
    const { rows } = await adminDb.query<{ left_ms: number | null }>(IN_FLIGHT_LEFT_MS, [sandboxId]);
    const inFlightLeftMs = rows[0]?.left_ms ?? 0;
    if (deps.graceMs > inFlightLeftMs + (preciseNow() - (deleted.deletedAt ?? preciseNow())) + 3_000) {
      await sleep(inFlightLeftMs + 500);
      attempts.push(await lateRecord('after-in-flight'));
    }
    return attempts;
  } finally {
    provisioner.clearFaults(sandboxId);
  }
}

// --- a quiet fleet ------------------------------------------------------------------------------

/** One leak of a quiet window: created when no run was active, gone (reclaimed) when seen gone. */
export interface QuietLeak {
  sandboxId: string;
  createdAtMs: number;
  goneAtMs: number | undefined;
}

/** One run of the stack's reclaimer, as the stack reported it (StackOptions.onReclaimerRun). */
export interface ReclaimerRun {
  startedAtMs: number;
  endedAtMs: number;
  /** What the run decided, for the report: "refused: <reason>", its counts, or "failed: <error>". */
  outcome: string;
  /** Its listing passed both brakes on its own: the kind of listing that confirms the pairing. */
  healthy: boolean;
  /**
   * A fault the suite injected fell inside the run (a backend termination, a database episode):
   * such a run is no step of the cadence invariant Q counts. Decided from the suite's own record
   * of its faults, never from what the reclaimer reported, so a reclaimer that fails on its own
   * (its deletes, its listing, its statements) is counted and judged.
   */
  impeded: boolean;
}

/** What a stack's reclaimer run reported: the harness reads it through reclaimerRunOf. */
export interface StackReclaimerRun {
  startedAtMs: number;
  endedAtMs: number;
  ended: { result: ReclaimerResult } | { error: unknown };
}

/** The harness's view of one run of the stack's reclaimer; `impeded` from the suite's own faults. */
export function reclaimerRunOf(
  run: StackReclaimerRun,
  injectedFaultDuring: (startMs: number, endMs: number) => boolean,
): ReclaimerRun {
  const { startedAtMs, endedAtMs } = run;
  const impeded = injectedFaultDuring(startedAtMs, endedAtMs);
  if ('error' in run.ended) {
    const { error } = run.ended;
    const message = error instanceof Error ? error.message : String(error);
    return { startedAtMs, endedAtMs, outcome: `failed: ${message}`, healthy: false, impeded };
  }
  const { result } = run.ended;
  if (result.refused !== undefined) {
    return { startedAtMs, endedAtMs, outcome: `refused: ${result.refused}`, healthy: false, impeded };
  }
  const lifted = result.brakeLifted ? `, brake lifted (${result.brakeLifted.brake})` : '';
  return {
    startedAtMs,
    endedAtMs,
    outcome: `listed ${result.listed}, leaked ${result.leaked}, due ${result.due}, reclaimed ${result.reclaimed}, failed ${result.failed}${lifted}`,
    healthy: result.healthy,
    impeded,
  };
}

/** A window in which no run was active and only leaks were live (reclaim-checks.ts, invariant Q). */
export interface QuietWindow {
  startedAtMs: number;
  leaks: QuietLeak[];
  /** The reclaimer's grace, in ms: a leak is due a grace after the run that first listed it. */
  graceMs: number;
  /** The reclaimer's runs from the window's start to the end of its watch. */
  reclaimerRuns: ReclaimerRun[];
}

/**
 * By when a quiet leak must be seen gone, counted in reclaimer runs, not in seconds (a loaded
 * machine stretches the interval; the property is the cadence): the first run that starts after
 * the leak was created lists it and starts its grace; the first run that starts a grace after that
 * one ended finds it due; one more run is allowed ("within two intervals after the grace"), so the
 * leak must be gone before the run after that starts. Undefined while that run has not started.
 * Runs an injected fault impeded are skipped: the cadence is that of a reclaimer the suite let work.
 */
export function quietLeakDueBy(
  leak: QuietLeak,
  runs: readonly ReclaimerRun[],
  graceMs: number,
): number | undefined {
  const after = runs
    .filter((run) => run.startedAtMs >= leak.createdAtMs && !run.impeded)
    .sort((a, b) => a.startedAtMs - b.startedAtMs);
  const first = after[0];
  if (first === undefined) return undefined;
  const due = after.findIndex((run) => run.startedAtMs >= first.endedAtMs + graceMs);
  return due === -1 ? undefined : after[due + 2]?.startedAtMs;
}

const ACTIVE_RUNS =
  'SELECT count(*)::int AS n FROM agent_runs WHERE runtime_cleanup_status_is_active(status)';

/**
 * Holds every other run out of the stack for a while: runs enter and leave (run-workers.ts), and a
 * quiet window waits until it is the only run left, keeps new ones waiting, and lets them go after.
 */
export class QuietFleet {
  #active = 0;
  #closed: Promise<void> | undefined;
  #windowOpen = false;
  /** Every reclaimer run of the stack, as it ends (the engine wires StackOptions.onReclaimerRun here). */
  readonly reclaimerRuns: ReclaimerRun[] = [];

  /** `injectedFaultDuring`: whether a fault the suite injected fell inside [startMs, endMs]. */
  constructor(
    private readonly injectedFaultDuring: (startMs: number, endMs: number) => boolean = () => false,
  ) {}

  /** A reclaimer run has listed healthily: the busy hours a quiet night follows have happened. */
  get healthyListingSeen(): boolean {
    return this.reclaimerRuns.some((run) => run.healthy);
  }

  /** A window's work is under way: every other run has left, and the stack is the reclaimer's. */
  get windowOpen(): boolean {
    return this.#windowOpen;
  }

  recordReclaimerRun(run: StackReclaimerRun): void {
    this.reclaimerRuns.push(reclaimerRunOf(run, this.injectedFaultDuring));
  }

  async enter(): Promise<void> {
    while (this.#closed) await this.#closed;
    this.#active += 1;
  }

  leave(): void {
    this.#active -= 1;
  }

  /**
   * Runs `work` once every other run has left (up to `deadlineMs`), with new runs held at the
   * door; undefined if another window is under way or the others did not leave in time.
   */
  async alone<T>(work: () => Promise<T>, deadlineMs: number): Promise<T | undefined> {
    if (this.#closed) return undefined;
    let open!: () => void;
    this.#closed = new Promise((resolve) => {
      open = resolve;
    });
    try {
      while (this.#active > 1 && preciseNow() < deadlineMs) await sleep(50);
      if (this.#active > 1) return undefined;
      this.#windowOpen = true;
      return await work();
    } finally {
      this.#windowOpen = false;
      this.#closed = undefined;
      open();
    }
  }
}

/**
 * A quiet night: every other run ended, no run active in the database, and then only leaks are
 * live — a few created now beside whatever the leak injection adds. The reclaimer runs with the
 * product's brakes (RECLAIM_CHAOS_ENV leaves RECLAIM_MAX_SHARE_PERCENT at its default), which
 * refuse such a listing on their own (no listed sandbox is recorded anywhere); the pairing evidence
 * of the busy hours must lift them. Each leak is watched until it is gone or long past its bound.
 */
/** The reclaimer's settings a quiet window is judged by. */
export interface QuietReclaimSettings {
  graceSeconds: number;
  intervalSeconds: number;
  /** One reclaim's DELETE bound: the listing that finds a leak due still has to delete it. */
  marginMs: number;
}

/**
 * How long a quiet window watches its leaks at most: twice the bound of invariant Q in wall-clock
 * terms (the bound itself is counted in reclaimer runs; this only stops a reclaimer that stopped).
 */
export function quietWatchMs(reclaim: QuietReclaimSettings): number {
  return 2 * (reclaim.graceSeconds * 1000 + 2 * reclaim.intervalSeconds * 1000 + reclaim.marginMs);
}

/**
 * The latest moment a quiet window may open before `deadlineMs`: a whole watch must fit. A window
 * the run's deadline cut short would be judged on too few reclaimer runs and read as a reclaimer
 * that stopped running (seen in a 2,000-run report: 40 concurrent runs took most of a run's 30 s to
 * leave, and the watch ended after two reclaimer runs).
 */
export function latestQuietWindowOpenMs(deadlineMs: number, reclaim: QuietReclaimSettings): number {
  return deadlineMs - quietWatchMs(reclaim);
}

export async function quietFleet(
  ctx: ProductionFaultContext & { adminDb: Database; quiet: QuietFleet },
  reclaim: QuietReclaimSettings,
  deadlineMs: number,
): Promise<QuietWindow | undefined> {
  const openBy = latestQuietWindowOpenMs(deadlineMs, reclaim);
  // The premise of a quiet night: busy hours before it, with a healthy listing (the kind that
  // confirms the pairing of this database with this provisioner; without one the brakes rightly
  // refuse). Seen in the reclaimer's own reports, not in the pairing table, so that a reclaimer
  // that stopped recording its evidence fails Q instead of never opening a window. Waited for with
  // the door open, so that the other runs make those hours.
  while (!ctx.quiet.healthyListingSeen) {
    if (preciseNow() >= openBy) return undefined;
    await sleep(200);
  }
  return ctx.quiet.alone(async () => {
    // The database agrees: no active run (the runs that left ended theirs).
    while ((await ctx.adminDb.query<{ n: number }>(ACTIVE_RUNS)).rows[0]!.n > 0) {
      if (preciseNow() >= openBy) return undefined;
      await sleep(100);
    }
    if (preciseNow() >= openBy) return undefined;
    const graceMs = reclaim.graceSeconds * 1000;
    const window: QuietWindow = { startedAtMs: preciseNow(), leaks: [], graceMs, reclaimerRuns: [] };
    for (let i = 0; i < 3; i += 1) {
      const sandboxId = `sbx-quiet-${randomUUID().slice(0, 12)}`;
      const response = await createSandbox(ctx.provisionerUrl, {
        sandboxId,
        threadId: 'crashed-before-record',
        uid: 'night',
      });
      if (!response.created) {
        throw new Error(`the provisioner refused a quiet-night leak: ${response.status}`);
      }
      window.leaks.push({ sandboxId, createdAtMs: preciseNow(), goneAtMs: undefined });
    }
    // Watched until each leak is gone or the reclaimer ran past its bound in runs (quietLeakDueBy),
    // so that a late reclaim is measured, not just missed; the other runs held meanwhile. The wall
    // clock only caps a reclaimer that stopped running (then Q reports how often it ran).
    const runsSinceStart = () =>
      ctx.quiet.reclaimerRuns.filter((run) => run.startedAtMs >= window.startedAtMs);
    // The window opened early enough for the whole watch (openBy): the cap alone ends it.
    const capMs = preciseNow() + quietWatchMs(reclaim);
    const judged = (leak: QuietLeak) =>
      leak.goneAtMs !== undefined || quietLeakDueBy(leak, runsSinceStart(), graceMs) !== undefined;
    while (!window.leaks.every(judged) && preciseNow() < capMs) {
      await sleep(50);
      for (const leak of window.leaks) {
        if (leak.goneAtMs === undefined && ctx.provisioner.sandbox(leak.sandboxId) === undefined) {
          leak.goneAtMs = preciseNow();
        }
      }
    }
    window.reclaimerRuns = runsSinceStart();
    return window;
  }, openBy);
}

// --- a deterministic id reused after a reclaim -------------------------------------------------

/** The conversation's next container after its deterministic id was reclaimed (invariant N). */
export interface ReusedIdAttempt {
  sandboxId: string;
  /** When the reclaim DELETE deleted the container (the provisioner's clock, preciseNow). */
  deletedAtMs: number;
  /** When the record of the next container was accepted, or undefined if never by the deadline. */
  acceptedAtMs: number | undefined;
  /** Records refused before (the reclaim's refusal while its DELETE may still act). */
  refused: number;
  /** The delete window plus margin (the reclaim guard's hold): by when the record must be accepted. */
  boundMs: number;
  /** The reclaimer's grace, for the report: a lockout that long is reclaimer bug 7. */
  graceMs: number;
}

const SCOPE_ROW = `
  SELECT generation::int AS generation FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text`;

/**
 * After the run's cleanup: its scope's id (derived from the scope, as a platform derives it from the
 * conversation) served as the platform's provisioner serves it — no generation in the listing, a
 * DELETE that ignores it — and a container created under it again and never recorded (a crashed
 * admission). Once the reclaimer deleted it, the conversation's next run records the id with the
 * generation the platform counts itself (docs/integration.md, step 3), retrying on 55006, until
 * accepted; then it is admitted with that sandbox, works, and ends (its cleanup deletes it).
 *
 * The record is tried before its POST: with the chaos grace (2 s) shorter than the delete window,
 * a container POSTed first and left waiting would itself be reclaimed and the wait start again
 * (in production the grace is hours). The refusal depends on the id and the time only.
 */
export async function reuseDeterministicIdAfterReclaim(
  ctx: ProductionFaultContext,
  scope: ScopeState,
  root: AdmittedRun,
  roots: AdmittedRun[],
  bounds: { holdMs: number; graceMs: number; retryMs: number; slackMs: number },
  deadlineMs: number,
): Promise<ReusedIdAttempt | undefined> {
  const { provisioner, platform } = ctx;
  const sandboxId = root.sandboxId;
  if (!(await ctx.fences.waitCleared([root.runId], left(deadlineMs)))) return undefined;
  if (provisioner.sandbox(sandboxId) !== undefined) return undefined;
  provisioner.setSandboxMode(sandboxId, PROVISIONER_MODE.platform);
  try {
    const lastSeq = Math.max(0, ...provisioner.audit().map((entry) => entry.seq));
    const response = await createSandbox(ctx.provisionerUrl, {
      sandboxId,
      threadId: scope.ref.threadId,
      uid: scope.ref.uid,
    });
    if (!response.created) return undefined;
    // The reclaimer's DELETE (nothing else deletes it: no run, no fence), carried out.
    const deletedBy = () =>
      provisioner
        .audit()
        .find(
          (entry) =>
            entry.seq > lastSeq &&
            entry.method === 'DELETE' &&
            entry.sandboxId === sandboxId &&
            entry.deletedAt !== undefined,
        );
    while (deletedBy() === undefined && preciseNow() < deadlineMs) await sleep(50);
    const deleted = deletedBy();
    if (deleted?.deletedAt === undefined) return undefined;
    const attempt: ReusedIdAttempt = {
      sandboxId,
      deletedAtMs: deleted.deletedAt,
      acceptedAtMs: undefined,
      refused: 0,
      boundMs: bounds.holdMs + bounds.retryMs + bounds.slackMs,
      graceMs: bounds.graceMs,
    };
    const current = (
      await ctx.operatorDb.query<{ generation: number }>(SCOPE_ROW, [scope.ref.uid, scope.ref.runtimeScopeId])
    ).rows[0];
    const generation = (current?.generation ?? 0) + 1;
    // Tried past the bound, so a longer lockout is measured, not only missed.
    const giveUpAt = Math.min(deadlineMs, deleted.deletedAt + attempt.boundMs + bounds.graceMs + 5_000);
    while (preciseNow() < giveUpAt) {
      try {
        await platform.recordSandbox(scope.ref, { sandboxId, generation });
        attempt.acceptedAtMs = preciseNow();
        break;
      } catch (error) {
        if ((error as { code?: string }).code !== '55006') throw error;
        attempt.refused += 1;
        await sleep(bounds.retryMs);
      }
    }
    if (attempt.acceptedAtMs !== undefined) {
      // The conversation's run: the container POSTed, then recorded as that POST answered it (the
      // generation the local provisioner counts, which its release DELETE then names), as
      // docs/integration.md asks after a 55006.
      const created = await createSandbox(ctx.provisionerUrl, {
        sandboxId,
        threadId: scope.ref.threadId,
        uid: scope.ref.uid,
      });
      const answered = created.generation ?? generation;
      const next = await platform.admitRootRun(scope.ref, {
        recordedSandbox: { sandboxId, generation: answered },
      });
      if (next) {
        ctx.scopes.noteSandbox(scope, sandboxId);
        roots.push(next);
        await platform.finishRun(next.runId, 'completed');
        await ctx.fences.waitCleared([next.runId], left(deadlineMs));
      }
    }
    return attempt;
  } finally {
    provisioner.setSandboxMode(sandboxId, undefined);
  }
}

// --- an admission racing the reclaim guard, under REPEATABLE READ -------------------------------

/**
 * The reclaimer has listed the sandbox (its grace runs from here): how long until it is due, by the
 * database's clock and the grace the guard applies (never below the deployment's of record), as
 * runtime_cleanup_begin_reclaim reads them.
 */
const DUE_IN_MS = `
  SELECT GREATEST(0, EXTRACT(EPOCH FROM first_seen_at
      + make_interval(secs => runtime_cleanup_setting_of_record('reclaim_grace_seconds', $2::float8))
      - clock_timestamp()) * 1000)::float8 AS due_in_ms
  FROM runtime_reclaim_sightings WHERE sandbox_id = $1::text`;
const RUNNING_IN_SCOPE = `
  SELECT id FROM agent_runs WHERE uid = $1::text AND runtime_scope_id = $2::text AND status = 'running'`;
/**
 * The reclaim guard of this scope waiting for the scope's lock: a stack backend inside
 * runtime_cleanup_begin_reclaim, waiting for the advisory lock whose key is the scope's
 * (pg_advisory_xact_lock(bigint) shows the key's high half as classid, the low half as objid,
 * objsubid 1). Any advisory wait would also match the scope's own cleanups, which wait on the
 * admission's lock too, and count a race that never met the guard.
 */
const RECLAIM_GUARD_WAITS_FOR_SCOPE = `
  SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
  WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
    AND ((l.classid::bigint << 32) | l.objid::bigint) = runtime_cleanup_lock_key($2::text, $3::text)
    AND a.application_name = $1::text AND a.datname = current_database()
    AND a.query ILIKE '%runtime_cleanup_begin_reclaim%'`;
/** How long before the leak is due the admission takes the scope's lock. */
const LOCK_BEFORE_DUE_MS = 1_000;

/**
 * How long the race's admission holds the scope's lock, waiting for the guard: taken a second
 * before the leak is due, it meets the guard at a listing within two intervals after, plus a
 * margin for a loaded machine; never past the harness pools' idle-in-transaction limit (less 5 s
 * for the insert and the commit), which would end the admission as a harness error. The grace is
 * not part of it: that wait happens before the transaction opens.
 */
export function admissionHoldMs(intervalSeconds: number): number {
  return Math.min(
    HARNESS_STATEMENT_TIMEOUT_MS - 5_000,
    LOCK_BEFORE_DUE_MS + 2 * intervalSeconds * 1000 + 4_000,
  );
}

/** Whether the scope's reclaim guard, run by the stack, is waiting for the scope's lock now. */
export async function reclaimGuardWaitsForScope(
  adminDb: Database,
  stackApplicationName: string,
  scope: { uid: string; runtimeScopeId: string },
): Promise<boolean> {
  const { rowCount } = await adminDb.query(RECLAIM_GUARD_WAITS_FOR_SCOPE, [
    stackApplicationName,
    scope.uid,
    scope.runtimeScopeId,
  ]);
  return (rowCount ?? 0) > 0;
}

/** What one play of the race came to: whether it met the guard, and the run it admitted. */
export interface ReclaimGuardRace {
  /** The guard waited on this scope's lock while the admission held it, and a run was inserted. */
  raced: boolean;
  /** The run admitted and handed the sandbox, if the admission got that far. */
  admitted: AdmittedRun | undefined;
}

/**
 * Reclaimer bug 1's race, played for real: after the run's cleanup, its scope's id is created again
 * and never recorded (a leak the scope's row names). Shortly before the reclaimer finds the leak due,
 * the platform admits a run into the scope the documented way — its transaction takes the scope's
 * lock and inserts the run — and holds the lock until the scope's reclaim guard is seen waiting for
 * it, then commits. A guard whose snapshot predates its lock (REPEATABLE READ) sees the scope idle
 * and deletes the container the admitted run is then handed (its POST reuses it): invariant GC at
 * the DELETE's arrival.
 *
 * The wait for the leak to come due happens outside the transaction, so that a long grace
 * (`--reclaim-grace 30`) does not hold it open past the pool's idle-in-transaction limit; the lock
 * is taken a second before it is due, because the reclaimer deletes at the first listing that finds
 * it due, and a leak deleted before the admission began raced nothing (a forced run once missed its
 * trigger so).
 */
export async function admitWhileReclaimGuardWaits(
  ctx: ProductionFaultContext,
  deps: {
    adminDb: Database;
    stackApplicationName: string;
    graceSeconds: number;
    intervalSeconds: number;
  },
  scope: ScopeState,
  root: AdmittedRun,
  roots: AdmittedRun[],
  deadlineMs: number,
): Promise<ReclaimGuardRace> {
  const { provisioner, platform } = ctx;
  const missed: ReclaimGuardRace = { raced: false, admitted: undefined };
  const sandboxId = root.sandboxId;
  if (!(await ctx.fences.waitCleared([root.runId], left(deadlineMs)))) return missed;
  if (provisioner.sandbox(sandboxId) !== undefined) return missed;
  const response = await createSandbox(ctx.provisionerUrl, {
    sandboxId,
    threadId: scope.ref.threadId,
    uid: scope.ref.uid,
  });
  if (!response.created) return missed;
  const dueInMs = async () =>
    (await deps.adminDb.query<{ due_in_ms: number }>(DUE_IN_MS, [sandboxId, deps.graceSeconds])).rows[0]
      ?.due_in_ms;
  for (;;) {
    if (preciseNow() >= deadlineMs || provisioner.sandbox(sandboxId) === undefined) return missed;
    const due = await dueInMs();
    if (due !== undefined && due <= LOCK_BEFORE_DUE_MS) break;
    await sleep(due === undefined ? 50 : Math.min(500, due - LOCK_BEFORE_DUE_MS));
  }
  let guardWaited = false;
  const admitting = platform.admitRootRun(scope.ref, {
    beforeCommit: async () => {
      const until = Math.min(deadlineMs, preciseNow() + admissionHoldMs(deps.intervalSeconds));
      while (!guardWaited && preciseNow() < until) {
        if (await reclaimGuardWaitsForScope(deps.adminDb, deps.stackApplicationName, scope.ref))
          guardWaited = true;
        else await sleep(10);
      }
    },
  });
  let refusedSandbox = false;
  const next = await admitting.catch(async (error: unknown) => {
    // Admitted, then its sandbox refused (55006: the container is being reclaimed, a DELETE that
    // should never have been sent): the platform ends the run that got no sandbox.
    if ((error as { code?: string }).code !== '55006') throw error;
    refusedSandbox = true;
    const { rows } = await ctx.operatorDb.query<{ id: string }>(RUNNING_IN_SCOPE, [
      scope.ref.uid,
      scope.ref.runtimeScopeId,
    ]);
    for (const row of rows) await platform.finishRun(row.id, 'failed');
    return undefined;
  });
  // Neither a run nor a refused sandbox: the admission found the scope fenced and inserted no run,
  // so the guard had nothing to race.
  const inserted = next !== undefined || refusedSandbox;
  if (next) {
    ctx.scopes.noteSandbox(scope, next.sandboxId);
    roots.push(next);
    // The run works in the container it was handed a while: a DELETE now lands under it.
    await sleep(1_000);
    await platform.finishRun(next.runId, 'completed');
  }
  return { raced: guardWaited && inserted, admitted: next };
}

/**
 * POST /api/sandboxes as a platform's admission sends it (a leak is one whose record never
 * followed): whether the provisioner created (or reused) it, and the generation it answered.
 */
async function createSandbox(
  provisionerUrl: string,
  sandbox: { sandboxId: string; threadId: string; uid: string },
): Promise<{ created: boolean; status: number; generation: number | undefined }> {
  const response = await fetch(new URL('/api/sandboxes', provisionerUrl), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      sandbox_id: sandbox.sandboxId,
      thread_id: sandbox.threadId,
      user_id: sandbox.uid,
    }),
    signal: AbortSignal.timeout(5_000),
  });
  const created = response.status === 200 || response.status === 201;
  const body = created ? ((await response.json().catch(() => ({}))) as { generation?: unknown }) : undefined;
  if (!created) await response.body?.cancel();
  return {
    created,
    status: response.status,
    generation: typeof body?.generation === 'number' ? body.generation : undefined,
  };
}
