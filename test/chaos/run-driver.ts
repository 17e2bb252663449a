/**
 * Plays one chaos run: the lifecycle of a root run (and any sibling root, subagents, or runs
 * admitted by the admission attempts), with every fault of its plan fired inside its fault window,
 * then the faults lifted and the fences awaited. What happened is returned as a RunRecord; the
 * invariants are checked elsewhere, against the ledger and the provisioner's audit.
 */
import { randomUUID } from 'node:crypto';
import type { Database } from '../../functions/adapters/database.ts';
import type { Queues } from '../../functions/adapters/queues.ts';
import { deleteInFlightSeconds } from '../../functions/cleanup/guarded-delete.ts';
import type { AdmittedRun, PlatformSimulator } from '../../infra/local/platform.ts';
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import { preciseNow } from './clock.ts';
import { type DatabaseEpisodes, STORM_MIN_CONNECTIONS, STORM_MIN_KILLS } from './db-episodes.ts';
import { holdLock } from './db-faults.ts';
import { type ForcedFaultRecord, firedBy, watchDeleteFaulted } from './forced-fault.ts';
import type { CrashBoundary, MessageLog, SentMessage } from './message-log.ts';
import {
  type ConsumedQueue,
  FaultKind,
  LYING_PROVISIONER_FAULTS,
  PROVISIONER_FAULT_KINDS,
  provisionerFault,
  type RunPlan,
  type Timeouts,
} from './plan.ts';
import {
  changeWorkdir,
  type FenceWatcher,
  type RecreateOutcome,
  recreateSandbox,
  type ScopePool,
  type ScopeState,
} from './platform-ops.ts';
import {
  armForceClear,
  disarmForceClear,
  type ForgeryProps,
  forceClearDuringRelease,
  type ProductionFaultContext,
  prepareForgery,
  readmitWithSloppyUpsert,
  sendForgedReleases,
} from './production-faults.ts';
import type { Rng } from './random.ts';
import {
  admitDuringDeleteCarriedOutLater,
  admitWhileReclaimGuardWaits,
  failStatementAfterReclaimDelete,
  type QuietFleet,
  quietFleet,
  type ReclaimFaultState,
  reuseDeterministicIdAfterReclaim,
} from './reclaim-faults.ts';

export interface RunContext {
  platform: PlatformSimulator;
  platformDb: Database;
  lockerDb: Database;
  provisioner: LocalProvisioner;
  provisionerUrl: string;
  messages: MessageLog;
  replayQueues: Queues;
  hostileQueues: Queues;
  scopes: ScopePool;
  fences: FenceWatcher;
  timeouts: Timeouts;
  /** Hostile bodies, drawn for this run from the seed. */
  hostileBodies: (rng: Rng, count: number) => Array<{ queue: ConsumedQueue; body: string }>;
  /** How long a run waits for its fences after its faults stopped before it is reported as stuck. */
  clearTimeoutMs: number;
  /** How long past its window a run waits for its forced fault to fire (see forced-fault.ts). */
  forcedFaultTimeoutMs: number;
  /** Work that outlives the run (late replays); awaited before the final checks. */
  background: Set<Promise<unknown>>;
  /** The faults of issue 11 (production-faults.ts) and what they leave for the final checks. */
  production: ProductionFaultContext;
  /** Stack-wide database episodes: termination storms, connects that never answer. */
  episodes: DatabaseEpisodes;
  /** The reclaimer runs beside the protocol (the reclaimer's fault kinds need it). */
  reclaimOn: boolean;
  /** The reclaimer's grace and interval (RECLAIM_CHAOS_ENV, or `--reclaim-grace`). */
  reclaimSettings: { graceSeconds: number; intervalSeconds: number };
  /** What the reclaimer's fault kinds record for their invariants (reclaim-checks.ts). */
  reclaimFaults: ReclaimFaultState;
  /** Sees the stack's backends and terminates them (a reclaimer fault). */
  adminDb: Database;
  stackApplicationName: string;
  /** Holds the other runs out for a quiet window. */
  quiet: QuietFleet;
}

export interface RunRecord {
  index: number;
  kinds: FaultKind[];
  scope: { uid: string; runtimeScopeId: string };
  /** Root runs this chaos run created (the lifecycle's root, a sibling, admitted extras). */
  rootRunIds: string[];
  childRunIds: string[];
  finishedAtMs: number;
  faultsStoppedAtMs: number;
  cleared: boolean;
  admissions: { attempts: number; refused: number; admitted: number };
  recreate: RecreateOutcome | null;
  expectedLeak: boolean;
  /** The coverage cycle's fault for this run, and whether it fired. */
  forced: ForcedFaultRecord | undefined;
  errors: string[];
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

export async function playRun(
  ctx: RunContext,
  plan: RunPlan & { provisionerKinds: FaultKind[] },
  rng: Rng,
): Promise<RunRecord> {
  const { platform, messages, provisioner } = ctx;
  const kinds = new Set<FaultKind>();
  const errors: string[] = [];
  const note = (kind: FaultKind, by = 1) => {
    kinds.add(kind);
    messages.count(kind, by);
  };
  const guard = async <T>(what: string, work: () => Promise<T>): Promise<T | undefined> => {
    try {
      return await work();
    } catch (error) {
      errors.push(`${what}: ${(error as Error).message}`);
      return undefined;
    }
  };

  const scope = await ctx.scopes.take(plan.reuseScope, (length) => rng.int(0, length - 1));
  scope.runs += 1;
  const root = await admitUntilFree(ctx, scope);
  const roots: AdmittedRun[] = [root];
  const childRunIds: string[] = [];
  const lying = plan.provisionerKinds.some((kind) => LYING_PROVISIONER_FAULTS.has(kind));
  if (lying) scope.retired = true;

  if (plan.concurrentRoot) {
    const sibling = await platform.admitRootRun(scope.ref);
    if (sibling) {
      ctx.scopes.noteSandbox(scope, sibling.sandboxId);
      roots.push(sibling);
      note(FaultKind.CONCURRENT_ROOT);
    }
  }
  const lateChildren: Array<{ runId: string; lateByMs: number }> = [];
  for (const child of plan.children) {
    const runId = await platform.startSubagent(root);
    childRunIds.push(runId);
    if (child.lateByMs === null) continue;
    lateChildren.push({ runId, lateByMs: child.lateByMs });
    note(FaultKind.LATE_CHILD);
  }

  // Provisioner faults go on the sandbox before anything can delete it; the generation a 409
  // names is relative to the one just acquired.
  const forcedDelete =
    plan.forced !== undefined && PROVISIONER_FAULT_KINDS.has(plan.forced)
      ? watchDeleteFaulted(provisioner, root.sandboxId)
      : undefined;
  // The force-clear's slow DELETE first: the provisioner applies a sandbox's faults in order.
  if (plan.forceClearDuringRelease) armForceClear(ctx.production, root);
  let forgery: ForgeryProps | undefined;
  if (plan.forgedReleases) {
    forgery = await guard('forgery', () =>
      prepareForgery(ctx.production, root, (length) => rng.int(0, length - 1)),
    );
  }
  for (const kind of plan.provisionerKinds) {
    const fault = provisionerFault(kind, rng, ctx.timeouts, root.generation);
    provisioner.setFault(root.sandboxId, fault);
    note(kind);
  }
  for (const run of roots) {
    for (const crash of plan.crashes) messages.armCrash(run.runId, crash);
    for (const fn of plan.droppedAcks) messages.dropAck(run.runId, fn);
  }
  // Armed before the run finishes: the publish it holds can follow the finish at once.
  const afterDelete = plan.recreateSandbox ? messages.holdAfterDelete(root.runId) : undefined;

  await sleep(plan.workMs);
  for (const [index, runId] of childRunIds.entries()) {
    if (plan.children[index]?.lateByMs === null) await platform.finishRun(runId, 'completed');
  }
  for (const sibling of roots.slice(1)) await platform.finishRun(sibling.runId, plan.terminalStatus);
  const finishedAtMs = preciseNow();
  const windowEndMs = finishedAtMs + plan.faultWindowMs;
  /** A forced fault is waited for up to here; any other fault only within the window. */
  const forcedDeadlineMs = windowEndMs + ctx.forcedFaultTimeoutMs;
  const isForced = (kind: FaultKind) => plan.forced === kind;
  if (!plan.announce) note(FaultKind.ANNOUNCEMENT_LOST);
  await platform.finishRun(root.runId, plan.terminalStatus, { announce: plan.announce });

  // --- the fault window ---------------------------------------------------------------------
  const inWindow: Array<Promise<unknown>> = [];
  const at = (ms: number, work: () => Promise<unknown>) =>
    inWindow.push(sleep(ms).then(() => guard('fault', work)));

  for (const child of lateChildren) at(child.lateByMs, () => platform.finishRun(child.runId, 'completed'));
  for (const lock of plan.locks) {
    at(lock.atMs, async () => {
      const target =
        lock.kind === FaultKind.DB_ROW_LOCK_HELD_ABOVE_TIMEOUT
          ? { kind: 'row' as const, runId: root.runId }
          : { kind: 'advisory' as const, uid: scope.ref.uid, runtimeScopeId: scope.ref.runtimeScopeId };
      // The locker gives up when a cleanup holds the lock longer than its own lock timeout; a
      // forced lock fault tries again until it held the lock.
      do {
        if (await holdLock(ctx.lockerDb, target, lock.holdMs)) {
          note(lock.kind);
          return;
        }
      } while (isForced(lock.kind) && preciseNow() < forcedDeadlineMs);
    });
  }
  const admissions = { attempts: 0, refused: 0, admitted: 0 };
  for (const atMs of plan.admissionAttemptsAtMs) {
    at(atMs, async () => {
      admissions.attempts += 1;
      note(FaultKind.ADMISSION_DURING_CLEANUP);
      const admitted = await platform.admitRootRun(scope.ref);
      if (!admitted) {
        admissions.refused += 1;
        return;
      }
      // The fence was already down: a legitimate new run, which must be cleaned up in turn.
      admissions.admitted += 1;
      ctx.scopes.noteSandbox(scope, admitted.sandboxId);
      roots.push(admitted);
      await platform.finishRun(admitted.runId, plan.terminalStatus);
    });
  }
  if (plan.workdirChangeAtMs !== null) {
    at(plan.workdirChangeAtMs, async () => {
      await changeWorkdir(ctx.platformDb, scope.ref);
      note(FaultKind.WORKDIR_CHANGED);
    });
  }
  let recreate: RecreateOutcome | null = null;
  if (plan.recreateSandbox && afterDelete) {
    const { newId } = plan.recreateSandbox;
    const kind = newId ? FaultKind.SANDBOX_REPLACED_NEW_ID : FaultKind.SANDBOX_RECREATED;
    inWindow.push(
      guard('recreate', async () => {
        // Right after the cleanup's DELETE, before its finalize: the moment the identity check of
        // phase 3 exists for. The release function's finalize publish is held there (the DELETE
        // is done, phase 3 cannot start), the platform re-provisions, and the publish goes on.
        try {
          const reached = await firedBy(afterDelete.reached, isForced(kind) ? forcedDeadlineMs : windowEndMs);
          if (!reached) return;
          recreate = await recreateSandbox(ctx.platformDb, ctx.provisionerUrl, scope, newId, (id) =>
            ctx.scopes.noteSandbox(scope, id),
          );
          if (recreate === 'recreated' || recreate === 'replaced') note(kind);
        } finally {
          afterDelete.release();
        }
      }),
    );
  }
  if (plan.hostileMessages > 0) {
    at(0, async () => {
      for (const { queue, body } of ctx.hostileBodies(rng, plan.hostileMessages)) {
        await ctx.hostileQueues.send(
          queue,
          body,
          queue === 'runtime-release.fifo'
            ? { groupId: `hostile-${randomUUID()}`, deduplicationId: randomUUID() }
            : {},
        );
        note(FaultKind.HOSTILE_MESSAGE);
      }
    });
  }
  const deadlineOf = (kind: FaultKind) => (isForced(kind) ? forcedDeadlineMs : windowEndMs);
  if (plan.forceClearDuringRelease) {
    const kind = FaultKind.FORCE_CLEAR_DURING_RELEASE;
    inWindow.push(
      guard('force-clear', async () => {
        const attempt = await forceClearDuringRelease(ctx.production, scope, root, roots, deadlineOf(kind));
        if (attempt?.duringDelete) note(kind);
      }),
    );
  }
  if (forgery) {
    const props = forgery;
    const kind = FaultKind.FORGED_RELEASE;
    inWindow.push(
      guard('forged releases', async () => {
        const sent = await sendForgedReleases(ctx.production, root, props, roots, deadlineOf(kind));
        if (sent > 0) note(kind, sent);
      }),
    );
  }
  for (const [planned, kind, upsert] of [
    [plan.upsertKeepsReleasedAt, FaultKind.UPSERT_KEEPS_RELEASED_AT, 'keeps-released'],
    [plan.upsertBypassingTriggers, FaultKind.UPSERT_BYPASSING_TRIGGERS, 'keeps-released-bypassing-triggers'],
  ] as const) {
    if (!planned) continue;
    inWindow.push(
      guard('sloppy upsert', async () => {
        // The scope's next run comes whenever the cleanup is done: waited for as a forced fault is.
        if (await readmitWithSloppyUpsert(ctx.production, scope, root, roots, forcedDeadlineMs, upsert))
          note(kind);
      }),
    );
  }
  if (plan.terminationStorm) {
    const { atMs, ms } = plan.terminationStorm;
    const kind = FaultKind.DB_TERMINATION_STORM;
    at(atMs, async () => {
      const report = await ctx.episodes.storm(ms, deadlineOf(kind));
      if (report.kills >= STORM_MIN_KILLS && report.connectedAtStart >= STORM_MIN_CONNECTIONS) note(kind);
    });
  }
  if (plan.connectsNeverAnswer) {
    const { atMs, ms } = plan.connectsNeverAnswer;
    const kind = FaultKind.DB_CONNECT_NEVER_ANSWERS;
    at(atMs, async () => {
      if ((await ctx.episodes.stallConnects(ms, deadlineOf(kind))) > 0) note(kind);
    });
  }
  if (plan.repeatableRead) {
    const { atMs, ms } = plan.repeatableRead;
    const kind = FaultKind.DB_REPEATABLE_READ_DEFAULT;
    if (!ctx.reclaimOn) {
      at(atMs, async () => {
        if ((await ctx.episodes.repeatableReadDefault(ms, deadlineOf(kind))) > 0) note(kind);
      });
    } else if (!scope.retired) {
      // With the reclaimer: under the setting, an admission races the reclaim guard for the
      // scope's lock (bug 1), once the run's cleanup is done.
      inWindow.push(
        guard('repeatable read', async () => {
          const until = isForced(kind) ? forcedDeadlineMs : windowEndMs + 30_000;
          if (!(await ctx.fences.waitCleared([root.runId], Math.max(0, until - preciseNow())))) return;
          let raced = false;
          const race = async () => {
            // A forced race that found no guard waiting (the reclaimer was slow to list, say) is
            // played again on the scope's latest run, until its deadline.
            let latest = root;
            for (;;) {
              const play = await admitWhileReclaimGuardWaits(
                ctx.production,
                {
                  adminDb: ctx.adminDb,
                  stackApplicationName: ctx.stackApplicationName,
                  ...ctx.reclaimSettings,
                },
                scope,
                latest,
                roots,
                until,
              );
              raced = play.raced;
              if (raced || !isForced(kind) || preciseNow() >= until) break;
              latest = play.admitted ?? latest;
              await sleep(200);
            }
          };
          const connected = await ctx.episodes.repeatableReadDefault(ms, until, race);
          if (connected > 0 && raced) note(kind);
        }),
      );
    }
  }
  if (plan.reclaimDeletedLater) {
    const fault = plan.reclaimDeletedLater;
    if (!ctx.reclaimOn) {
      if (isForced(fault.kind)) errors.push(`${fault.kind} needs the reclaimer (ChaosOptions.reclaim)`);
    } else if (!scope.retired) {
      inWindow.push(
        guard('delete carried out later', async () => {
          // After the run's cleanup, whenever it is done: waited for as a forced fault is.
          if (
            await admitDuringDeleteCarriedOutLater(
              ctx.production,
              scope,
              root,
              roots,
              fault,
              isForced(fault.kind) ? forcedDeadlineMs : windowEndMs + 30_000,
            )
          )
            note(fault.kind);
        }),
      );
    }
  }
  if (plan.statementAfterReclaimDeleteFails) {
    const kind = FaultKind.RECLAIM_STATEMENT_AFTER_DELETE_FAILS;
    if (!ctx.reclaimOn) {
      if (isForced(kind)) errors.push(`${kind} needs the reclaimer (ChaosOptions.reclaim)`);
    } else {
      inWindow.push(
        guard('statement after a reclaim DELETE fails', async () => {
          const deps = {
            ctx: ctx.production,
            lockerDb: ctx.lockerDb,
            adminDb: ctx.adminDb,
            stackApplicationName: ctx.stackApplicationName,
            lockTimeoutMs: ctx.timeouts.databaseLockMs,
            graceMs: ctx.reclaimSettings.graceSeconds * 1000,
          };
          // The leak is reclaimed a grace after it is first listed: waited for as a forced fault is.
          const until = isForced(kind) ? forcedDeadlineMs : windowEndMs + 30_000;
          do {
            const attempts = await failStatementAfterReclaimDelete(deps, scope, until);
            if (attempts) {
              ctx.reclaimFaults.lateRecords.push(...attempts);
              note(kind);
              return;
            }
          } while (isForced(kind) && preciseNow() < until);
        }),
      );
    }
  }
  if (plan.quietFleet) {
    const kind = FaultKind.RECLAIM_QUIET_FLEET;
    if (!ctx.reclaimOn) {
      if (isForced(kind)) errors.push(`${kind} needs the reclaimer (ChaosOptions.reclaim)`);
    } else {
      inWindow.push(
        guard('quiet fleet', async () => {
          // Quiet means this run's own cleanup is over too.
          const until = isForced(kind) ? forcedDeadlineMs : windowEndMs + 30_000;
          if (!(await ctx.fences.waitCleared([root.runId], Math.max(0, until - preciseNow())))) return;
          const reclaim = {
            graceSeconds: ctx.reclaimSettings.graceSeconds,
            intervalSeconds: ctx.reclaimSettings.intervalSeconds,
            // One reclaim's DELETE bound: the listing that finds a leak due still has to delete it.
            marginMs: ctx.timeouts.runtimeCleanupMs,
          };
          do {
            const window = await quietFleet(
              { ...ctx.production, adminDb: ctx.adminDb, quiet: ctx.quiet },
              reclaim,
              until,
            );
            if (window) {
              ctx.reclaimFaults.quietWindows.push(window);
              note(kind);
              return;
            }
            await sleep(200);
          } while (isForced(kind) && preciseNow() < until);
        }),
      );
    }
  }
  if (plan.deterministicIdReused) {
    const kind = FaultKind.RECLAIM_DETERMINISTIC_ID_REUSED;
    if (!ctx.reclaimOn) {
      if (isForced(kind)) errors.push(`${kind} needs the reclaimer (ChaosOptions.reclaim)`);
    } else if (!scope.retired) {
      inWindow.push(
        guard('deterministic id reused', async () => {
          const { runtimeCleanupMs, provisionerDeleteMs, databaseLockMs } = ctx.timeouts;
          const bounds = {
            // The reclaim guard's hold: the delete window plus margin, counted from the guard.
            holdMs:
              deleteInFlightSeconds(runtimeCleanupMs, provisionerDeleteMs / 1000, databaseLockMs) * 1000,
            graceMs: ctx.reclaimSettings.graceSeconds * 1000,
            // The platform's retry interval, plus a second for one record's round trip under load.
            retryMs: 250,
            slackMs: 1_000,
          };
          const until = isForced(kind) ? forcedDeadlineMs : windowEndMs + 60_000;
          const attempt = await reuseDeterministicIdAfterReclaim(
            ctx.production,
            scope,
            root,
            roots,
            bounds,
            until,
          );
          if (attempt) {
            ctx.reclaimFaults.reusedIds.push(attempt);
            note(kind);
          }
        }),
      );
    }
  }
  const replays: Array<Promise<unknown>> = [];
  for (const replay of plan.replays) {
    const runIds = () => roots.map((run) => run.runId);
    // A forced duplicate waits for a message to duplicate; a random one takes what was sent by then.
    const waitUntilMs = isForced(FaultKind.DUPLICATE_DELIVERY) ? forcedDeadlineMs : undefined;
    const work = sleep(replay.delayMs).then(() =>
      guard('replay', async () => {
        const replayed = await replayOne(ctx, runIds, replay.queue, rng, waitUntilMs);
        if (replayed) note(FaultKind.DUPLICATE_DELIVERY);
        if (replayed === 'reordered') note(FaultKind.REORDERED_DELIVERY);
      }),
    );
    replays.push(work);
    ctx.background.add(work);
    void work.finally(() => ctx.background.delete(work));
  }

  await sleep(plan.faultWindowMs);
  await Promise.all(inWindow);
  const forced =
    plan.forced === undefined
      ? undefined
      : await untilForcedFaultFired(ctx, plan.forced, {
          rootRunId: root.runId,
          forcedDelete: forcedDelete?.fired,
          replays,
          done: kinds,
          recreate: () => recreate,
          deadlineMs: forcedDeadlineMs,
          windowEndMs,
        });
  forcedDelete?.stop();
  if (forced && !forced.fired) {
    errors.push(
      `forced fault ${forced.kind} never reached its trigger point within ${ctx.forcedFaultTimeoutMs} ms after its window`,
    );
  }
  // --- faults stop ----------------------------------------------------------------------------
  for (const sandboxId of scope.sandboxIds) provisioner.clearFaults(sandboxId);
  if (plan.forceClearDuringRelease) disarmForceClear(ctx.production, root);
  for (const run of roots) messages.disarm(run.runId);
  afterDelete?.release();
  const faultsStoppedAtMs = preciseNow();

  const cleared = await ctx.fences.waitCleared(
    roots.map((run) => run.runId),
    ctx.clearTimeoutMs,
  );
  ctx.scopes.give(scope);
  if (forgery) ctx.scopes.give(forgery.activeScope);
  return {
    index: plan.index,
    kinds: [...kinds],
    scope: { uid: scope.ref.uid, runtimeScopeId: scope.ref.runtimeScopeId },
    rootRunIds: roots.map((run) => run.runId),
    childRunIds,
    finishedAtMs,
    faultsStoppedAtMs,
    cleared,
    admissions,
    recreate,
    expectedLeak: lying,
    forced,
    errors,
  };
}

/** Waits (up to the deadline) for the run's forced fault to fire; see forced-fault.ts for each kind. */
async function untilForcedFaultFired(
  ctx: RunContext,
  kind: FaultKind,
  run: {
    rootRunId: string;
    forcedDelete: Promise<void> | undefined;
    replays: Array<Promise<unknown>>;
    done: ReadonlySet<FaultKind>;
    recreate: () => RecreateOutcome | null;
    deadlineMs: number;
    windowEndMs: number;
  },
): Promise<ForcedFaultRecord> {
  const { messages } = ctx;
  const left = () => Math.max(0, run.deadlineMs - preciseNow());
  let fired: boolean;
  if (PROVISIONER_FAULT_KINDS.has(kind)) {
    fired = run.forcedDelete !== undefined && (await firedBy(run.forcedDelete, run.deadlineMs));
  } else if (CRASH_BOUNDARIES.has(kind)) {
    fired = await messages.until(() => messages.hasCrashed(run.rootRunId, kind as CrashBoundary), left());
  } else if (kind === FaultKind.CRASH_BEFORE_ACK) {
    fired = await messages.until(() => messages.dropsLeft(run.rootRunId) === 0, left());
  } else if (kind === FaultKind.DUPLICATE_DELIVERY) {
    await Promise.all(run.replays);
    fired = run.done.has(kind);
  } else if (kind === FaultKind.SANDBOX_RECREATED || kind === FaultKind.SANDBOX_REPLACED_NEW_ID) {
    fired = run.recreate() === 'recreated' || run.recreate() === 'replaced';
  } else {
    fired = run.done.has(kind);
  }
  return { kind, fired, waitedMs: Math.max(0, Math.round(preciseNow() - run.windowEndMs)) };
}

const CRASH_BOUNDARIES: ReadonlySet<FaultKind> = new Set([
  FaultKind.CRASH_BEFORE_RELEASE_PUBLISH,
  FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH,
  FaultKind.CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED,
]);

/** A reused scope is idle (its fences were seen clear), so admission succeeds; retried for safety. */
async function admitUntilFree(ctx: RunContext, scope: ScopeState): Promise<AdmittedRun> {
  for (let attempt = 0; ; attempt += 1) {
    const admitted = await ctx.platform.admitRootRun(scope.ref);
    if (admitted) {
      ctx.scopes.noteSandbox(scope, admitted.sandboxId);
      return admitted;
    }
    if (attempt > 200) throw new Error(`scope ${scope.ref.runtimeScopeId} never became free for a new run`);
    await sleep(100);
  }
}

/**
 * Sends again a message the system already sent about one of the runs — a duplicate, and, when a
 * later message about the run exists, a reordered one. FIFO duplicates get a new deduplication id:
 * a real duplicate delivery is not a re-send of the same id, and fauxqs would drop that silently.
 */
async function replayOne(
  ctx: RunContext,
  runIds: () => string[],
  queue: ConsumedQueue,
  rng: Rng,
  waitUntilMs: number | undefined,
): Promise<'duplicate' | 'reordered' | undefined> {
  const all = (): SentMessage[] =>
    runIds().flatMap((runId) =>
      ctx.messages
        .messagesOf(runId)
        .filter(
          (message) =>
            message.origin !== 'replay' && message.origin !== 'hostile' && message.origin !== 'forged',
        ),
    );
  const candidates = () => all().filter((message) => message.queue === queue);
  if (waitUntilMs !== undefined) {
    // Every consumed queue carries a message about a cleaned-up run sooner or later.
    await ctx.messages.until(() => candidates().length > 0, Math.max(0, waitUntilMs - preciseNow()));
  }
  const found = candidates();
  if (found.length === 0) return undefined;
  const original = rng.pick(found);
  const options =
    queue === 'runtime-release.fifo'
      ? { groupId: original.options.groupId ?? 'replay', deduplicationId: randomUUID() }
      : {};
  const later = all().some((message) => message.sentAtMs > original.sentAtMs);
  await ctx.replayQueues.send(queue, original.body, options);
  return later ? 'reordered' : 'duplicate';
}
