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
import type { AdmittedRun } from '../../infra/local/platform.ts';
import type { AuditEntry } from '../../infra/local/provisioner/types.ts';
import { preciseNow } from './clock.ts';
import type { RunPlan } from './plan.ts';
import type { ScopeState } from './platform-ops.ts';
import type { ProductionFaultContext } from './production-faults.ts';

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
    const response = await fetch(new URL('/api/sandboxes', ctx.provisionerUrl), {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ sandbox_id: sandboxId, thread_id: scope.ref.threadId, user_id: scope.ref.uid }),
      signal: AbortSignal.timeout(5_000),
    });
    await response.body?.cancel();
    if (response.status !== 200 && response.status !== 201) {
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
