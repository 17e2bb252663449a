/**
 * The faults production showed and the suite once never generated (issue 11), played inside a
 * run's fault window. Each one is modelled as the outside world would do it — an operator, a
 * sloppy platform integration, a forger with the release queue's address — never by reaching
 * into the implementation:
 *
 * - FORCE_CLEAR_DURING_RELEASE: the scope is served by the platform's provisioner (POST reuses a
 *   live sandbox, DELETE ignores the generation); the run's first DELETE is slow and carried out
 *   even after the release gave up on it. While it is in flight an operator runs force-clear; if
 *   that goes through, the platform admits a new run at once, which is handed the still-live
 *   sandbox, and keeps it running until the late DELETE landed (invariant 2b judges it).
 * - FORGED_RELEASE: six well-formed release commands that are not the cleanup the database knows
 *   (wrong uid, wrong scope, a subagent run, a run not terminal, a sandbox nobody owns, a
 *   generation that never existed) sent straight to the release queue while the fence is up.
 *   Each must be refused with its own reason before any DELETE (invariant G, production-checks.ts).
 * - UPSERT_KEEPS_RELEASED_AT: once the run's cleanup is done (its generation released), the
 *   platform admits the scope's next run and records the new generation with an upsert that leaves
 *   `released_at` alone; that run then ends, and its cleanup must delete the new generation
 *   (invariant 1 judges a generation released only by a write that kept it, see invariants.ts).
 */
import { randomUUID } from 'node:crypto';
import type { Database } from '../../functions/adapters/database.ts';
import { publishCleaned, releaseGroupId } from '../../functions/adapters/publish.ts';
import type { Queues } from '../../functions/adapters/queues.ts';
import { ErrorCode, isCleanupError } from '../../functions/cleanup/errors.ts';
import { forceClear } from '../../functions/cleanup/force-clear.ts';
import type { AdmittedRun, PlatformSimulator } from '../../infra/local/platform.ts';
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import { PROVISIONER_MODE } from '../../infra/local/provisioner/types.ts';
import { preciseNow } from './clock.ts';
import type { MessageLog } from './message-log.ts';
import type { Timeouts } from './plan.ts';
import type { FenceWatcher, ScopePool, ScopeState } from './platform-ops.ts';

/** What the production faults leave for the final checks. */
export interface ProductionFaultState {
  /** Live sandboxes no scope owns, named by forged releases: each must still be live at the end. */
  decoys: Set<string>;
  /** Forged release commands by message id, with the refusal each must meet. */
  forged: Map<string, ForgedExpectation>;
  /** Each forced clear attempted during an in-flight release, and what became of it. */
  forceClears: ForceClearAttempt[];
}

export function newProductionFaultState(): ProductionFaultState {
  return { decoys: new Set(), forged: new Map(), forceClears: [] };
}

export interface ForgedExpectation {
  variant: ForgedVariant;
  runId: string;
  /** Error codes its dead letter may carry. */
  codes: readonly string[];
  /**
   * Whether being skipped as stale (the fence already cleared: acknowledged, nothing sent) is
   * also right. Only for the checks that come after the fence's in the guard.
   */
  staleMayBeSkipped: boolean;
}

export type ForgedVariant =
  | 'wrong_uid'
  | 'wrong_scope'
  | 'subagent_run'
  | 'run_not_terminal'
  | 'unowned_sandbox'
  | 'unknown_generation';

export interface ForceClearAttempt {
  runId: string;
  /** 'applied', or the refusal's error code. */
  outcome: string;
  /** The DELETE was still in flight at the provisioner when the clear was tried. */
  duringDelete: boolean;
  /** A new run admitted right after (only if the clear went through, or admission ignored a block). */
  admittedRunId: string | undefined;
}

export interface ProductionFaultContext {
  platform: PlatformSimulator;
  operatorDb: Database;
  provisioner: LocalProvisioner;
  provisionerUrl: string;
  messages: MessageLog;
  /** The operator's and the forger's queue client (origin `forged`: never a capture). */
  forgedQueues: Queues;
  scopes: ScopePool;
  fences: FenceWatcher;
  timeouts: Timeouts;
  state: ProductionFaultState;
}

/** How long past its deadline a run waits for its forgeries to be taken off the queue. */
const FORGERY_SETTLE_MS = 60_000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
const left = (deadlineMs: number) => Math.max(0, deadlineMs - preciseNow());

// --- force-clear during an in-flight release --------------------------------------------------

/**
 * Before the run ends: its sandbox behind the platform's provisioner, and its first DELETE slow
 * enough (twice the delete timeout) that the release gives up on it while the provisioner still
 * carries it out.
 */
export function armForceClear(ctx: ProductionFaultContext, root: AdmittedRun): void {
  ctx.provisioner.setSandboxMode(root.sandboxId, PROVISIONER_MODE.platform);
  ctx.provisioner.setFault(root.sandboxId, {
    latencyMs: ctx.timeouts.provisionerDeleteMs * 2 + 500,
    completeIfAbandoned: true,
    times: 1,
  });
}

export function disarmForceClear(ctx: ProductionFaultContext, root: AdmittedRun): void {
  ctx.provisioner.setSandboxMode(root.sandboxId, undefined);
}

/**
 * Waits for the run's DELETE to arrive, then clears its fence as an operator would and, if the
 * clear went through, admits a new run in the scope at once; that run is kept running until the
 * DELETE finished, then ended. Returns the attempt, or undefined if no DELETE came by the deadline.
 */
export async function forceClearDuringRelease(
  ctx: ProductionFaultContext,
  scope: ScopeState,
  root: AdmittedRun,
  roots: AdmittedRun[],
  deadlineMs: number,
): Promise<ForceClearAttempt | undefined> {
  const isDelete = (entry: { method: string; sandboxId?: string }) =>
    entry.method === 'DELETE' && entry.sandboxId === root.sandboxId;
  let arrived: { seq: number };
  try {
    arrived = await ctx.provisioner.waitForRequest(isDelete, left(deadlineMs));
  } catch {
    return undefined;
  }
  const entryOf = () => ctx.provisioner.audit().find((entry) => entry.seq === arrived.seq);
  const inFlight = () => {
    const entry = entryOf();
    return entry !== undefined && entry.deletedAt === undefined && entry.outcome !== 'answered';
  };
  const duringDelete = inFlight();
  let outcome: string;
  try {
    const result = await forceClear(ctx.operatorDb, {
      runId: root.runId,
      reason: 'chaos: an operator clears a fence that looks stuck, mid-incident',
      actor: 'chaos-operator',
      dryRun: false,
    });
    outcome = result.applied ? 'applied' : 'dry_run';
    if (result.applied) {
      // As `ops force-clear` does after its clear: runtime-cleaned with forced: true.
      await publishCleaned(ctx.forgedQueues, {
        runId: root.runId,
        uid: result.plan.uid,
        runtimeScopeId: result.plan.runtimeScopeId,
        generation: result.plan.generation,
        cleanedAt: result.forcedAt,
        forced: true,
      });
    }
  } catch (error) {
    outcome = isCleanupError(error) ? error.code : `error: ${(error as Error).message}`;
  }
  // The platform admits the scope's next run as soon as admission lets it (blocked: refused).
  const next = await ctx.platform.admitRootRun(scope.ref);
  const attempt: ForceClearAttempt = {
    runId: root.runId,
    outcome,
    duringDelete,
    admittedRunId: next?.runId,
  };
  ctx.state.forceClears.push(attempt);
  if (next) {
    ctx.scopes.noteSandbox(scope, next.sandboxId);
    roots.push(next);
    // The new run works in the sandbox it was handed until the late DELETE is over.
    while (inFlight() && preciseNow() < deadlineMs) await sleep(50);
    await ctx.platform.finishRun(next.runId, 'completed');
  }
  return attempt;
}

// --- forged and mismatched release commands ---------------------------------------------------

export interface ForgeryProps {
  /** A finished subagent run of the root. */
  childRunId: string;
  /** A scope of its own with a root run still running. */
  activeScope: ScopeState;
  activeRun: AdmittedRun;
  /** A live sandbox no scope owns. */
  decoyId: string;
}

/** Before the run ends: the things the forged commands name (a subagent, an active run, a decoy). */
export async function prepareForgery(
  ctx: ProductionFaultContext,
  root: AdmittedRun,
  pickIndex: (length: number) => number,
): Promise<ForgeryProps> {
  const childRunId = await ctx.platform.startSubagent(root);
  await ctx.platform.finishRun(childRunId, 'completed');
  const activeScope = await ctx.scopes.take(false, pickIndex);
  activeScope.runs += 1;
  const activeRun = await ctx.platform.admitRootRun(activeScope.ref);
  if (!activeRun) throw new Error('a new scope refused its first run');
  ctx.scopes.noteSandbox(activeScope, activeRun.sandboxId);
  const decoyId = `sbx-decoy-${randomUUID()}`;
  const response = await fetch(new URL('/api/sandboxes', ctx.provisionerUrl), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: decoyId, thread_id: `thread-${decoyId}`, user_id: 'user-decoy' }),
    signal: AbortSignal.timeout(5_000),
  });
  await response.body?.cancel();
  if (response.status !== 200 && response.status !== 201) {
    throw new Error(`the provisioner refused the decoy sandbox: ${response.status}`);
  }
  ctx.state.decoys.add(decoyId);
  // Its first DELETE a little slow, so the fence is still up when the forgeries arrive.
  ctx.provisioner.setFault(root.sandboxId, {
    latencyMs: Math.round(ctx.timeouts.provisionerDeleteMs * 0.5),
    times: 1,
  });
  return { childRunId, activeScope, activeRun, decoyId };
}

/**
 * Once the stack published the run's release (the template every forgery starts from), sends the
 * six forgeries, waits until each was taken off the queue (processed or dead-lettered), then ends
 * the active run. Returns how many were sent (0: no release to copy by the deadline).
 */
export async function sendForgedReleases(
  ctx: ProductionFaultContext,
  root: AdmittedRun,
  props: ForgeryProps,
  roots: AdmittedRun[],
  deadlineMs: number,
): Promise<number> {
  const template = () =>
    ctx.messages
      .messagesOf(root.runId)
      .find((message) => message.queue === 'runtime-release.fifo' && message.origin === 'stack');
  let sent = 0;
  const ids: string[] = [];
  try {
    await ctx.messages.until(() => template() !== undefined, left(deadlineMs));
    const original = template();
    if (!original) return 0;
    const base = JSON.parse(original.body) as Record<string, unknown> & {
      uid: string;
      runtimeScopeId: string;
      generation: number;
    };
    const active = props.activeRun;
    const forgeries: Array<[ForgedVariant, Record<string, unknown>, readonly string[], boolean]> = [
      ['wrong_uid', { ...base, uid: `${base.uid}-forged` }, [ErrorCode.RELEASE_SCOPE_MISMATCH], false],
      [
        'wrong_scope',
        { ...base, uid: active.scope.uid, runtimeScopeId: active.scope.runtimeScopeId },
        [ErrorCode.RELEASE_SCOPE_MISMATCH],
        false,
      ],
      ['subagent_run', { ...base, runId: props.childRunId }, [ErrorCode.RELEASE_RUN_NOT_ROOT], false],
      [
        'run_not_terminal',
        {
          ...base,
          runId: active.runId,
          uid: active.scope.uid,
          runtimeScopeId: active.scope.runtimeScopeId,
          sandboxId: active.sandboxId,
          generation: active.generation,
        },
        [ErrorCode.RELEASE_RUN_NOT_TERMINAL],
        false,
      ],
      ['unowned_sandbox', { ...base, sandboxId: props.decoyId }, [ErrorCode.RELEASE_SANDBOX_MISMATCH], true],
      [
        'unknown_generation',
        { ...base, generation: base.generation + 1_000 },
        [ErrorCode.RELEASE_SANDBOX_MISMATCH],
        true,
      ],
    ];
    for (const [variant, body, codes, staleMayBeSkipped] of forgeries) {
      const command: Record<string, unknown> = { ...body, requestedAt: new Date().toISOString() };
      const messageId = await ctx.forgedQueues.send('runtime-release.fifo', JSON.stringify(command), {
        groupId: releaseGroupId(String(command.uid), String(command.runtimeScopeId)),
        deduplicationId: randomUUID(),
      });
      ctx.state.forged.set(messageId, { variant, runId: String(command.runId), codes, staleMayBeSkipped });
      ids.push(messageId);
      sent += 1;
    }
    // The active run stays active until every forgery was dealt with, however long the queue takes
    // on a loaded machine (up to a minute past the run's own deadline).
    const dealtWith = await ctx.messages.until(
      () => ids.every((id) => ctx.messages.acked.has(id)),
      left(Math.max(deadlineMs, preciseNow() + FORGERY_SETTLE_MS)),
    );
    if (!dealtWith) {
      // The active run ends below, and a forgery naming it may be read after that: it is then a
      // stale release of a finished run, and skipping it is right too.
      for (const id of ids) {
        const expected = ctx.state.forged.get(id);
        if (expected?.variant === 'run_not_terminal') expected.staleMayBeSkipped = true;
      }
    }
    return sent;
  } finally {
    await ctx.platform.finishRun(props.activeRun.runId, 'completed');
    roots.push(props.activeRun);
  }
}

// --- a new generation recorded with released_at kept ------------------------------------------

const SCOPE_SANDBOX = `
  SELECT sandbox_id, generation::int AS generation, released_at IS NOT NULL AS released
  FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text`;

/**
 * After the run's fence cleared with its generation released: the scope's next run admitted with
 * the sloppy upsert, then ended. Returns the new run (undefined if the moment never came).
 */
export async function readmitWithSloppyUpsert(
  ctx: ProductionFaultContext,
  scope: ScopeState,
  root: AdmittedRun,
  roots: AdmittedRun[],
  deadlineMs: number,
  upsert: 'keeps-released' | 'keeps-released-bypassing-triggers' = 'keeps-released',
): Promise<AdmittedRun | undefined> {
  if (!(await ctx.fences.waitCleared([root.runId], left(deadlineMs)))) return undefined;
  while (preciseNow() < deadlineMs) {
    const row = (
      await ctx.operatorDb.query<{ sandbox_id: string; generation: number; released: boolean }>(
        SCOPE_SANDBOX,
        [scope.ref.uid, scope.ref.runtimeScopeId],
      )
    ).rows[0];
    if (row?.released) {
      const next = await ctx.platform.admitRootRun(scope.ref, { upsert });
      if (next) {
        ctx.scopes.noteSandbox(scope, next.sandboxId);
        roots.push(next);
        await ctx.platform.finishRun(next.runId, 'completed');
        return next;
      }
    }
    await sleep(100);
  }
  return undefined;
}
