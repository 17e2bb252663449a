import { RunNotFoundError } from './errors.ts';
import type { Database, Executor } from './executor.ts';
import { inspectRun, isTerminalStatus } from './inspect-run.ts';
import { lockScope } from './scope-lock.ts';
import { type CleanupIdentity, DeferralReason, FinalizeOutcome, type FinalizeResult } from './types.ts';

/**
 * Clears the fence and marks the captured generation released, in one statement. The fence is
 * cleared only if it is still up; the generation only if it is still the captured one.
 */
const CLEAR_FENCE = `
  WITH cleared AS (
    UPDATE agent_runs SET runtime_cleanup_pending = false, updated_at = now()
    WHERE id = $1::text AND runtime_cleanup_pending
    RETURNING id
  ),
  released AS (
    UPDATE sandbox_runtimes SET released_at = now()
    WHERE uid = $2::text AND runtime_scope_id = $3::text AND generation = $4::bigint AND sandbox_id = $5::text
      AND released_at IS NULL AND EXISTS (SELECT 1 FROM cleared)
    RETURNING generation
  )
  SELECT (SELECT count(*) FROM cleared)::int AS cleared, to_json(now()) #>> '{}' AS cleaned_at`;

/**
 * Phase 3 — finalize, one short transaction after a confirmed delete (or when there was nothing
 * to delete): the same advisory lock, then lock and re-check the run. The fence is cleared only
 * if nothing the delete relied on moved: the fence is the one phase 1 saw, no run is active in
 * the scope, and the Workdir and the scope's sandbox generation are unchanged. Otherwise the
 * fence stays and the outcome says why; the caller defers or restarts at phase 1.
 *
 * Concurrent finalizes of one run converge: the first clears, the rest see ALREADY_CLEAR.
 */
export async function finalize(db: Database, identity: CleanupIdentity): Promise<FinalizeResult> {
  return db.withTransaction(async (tx) => {
    await lockScope(tx, identity);
    const facts = await inspectRun(tx, identity.runId);
    if (!facts) throw new RunNotFoundError(identity.runId);
    if (!facts.fencePending) return { outcome: FinalizeOutcome.ALREADY_CLEAR };

    const changed: string[] = [];
    if (facts.uid !== identity.uid || facts.runtimeScopeId !== identity.runtimeScopeId) changed.push('scope');
    if (facts.fenceSetAt !== identity.fenceSetAt) changed.push('fence');
    if (changed.length) return { outcome: FinalizeOutcome.IDENTITY_CHANGED, changed };

    if (!isTerminalStatus(facts.status)) {
      return {
        outcome: FinalizeOutcome.DEFERRED,
        reason: DeferralReason.RUN_NOT_TERMINAL,
        blockingRunId: identity.runId,
      };
    }
    if (facts.activeRunId) {
      return {
        outcome: FinalizeOutcome.DEFERRED,
        reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
        blockingRunId: facts.activeRunId,
      };
    }
    if (facts.workdirPath !== identity.workdirPath || facts.conversationUid !== identity.uid)
      changed.push('workdir');
    // The live sandbox is named by its id *and* its generation: the provisioner counts generations
    // per sandbox id, so a sandbox re-created under another id can carry the very same number
    // (found by the chaos suite: that sandbox was then marked released and never deleted).
    const live = facts.liveSandbox;
    if (live !== null && live.sandboxId !== identity.sandboxId) changed.push('sandbox');
    else if (live !== null && live.generation !== identity.generation) changed.push('generation');
    if (changed.length) return { outcome: FinalizeOutcome.IDENTITY_CHANGED, changed };

    return { outcome: FinalizeOutcome.CLEARED, cleanedAt: await clearFence(tx, identity) };
  });
}

/**
 * The write of phase 3, for a caller that holds the scope's advisory lock and the run's row lock
 * and has re-checked everything: clears the fence and marks that sandbox generation released.
 * Returns when it happened (ISO). The benchmarks' baseline reuses it so both designs write alike.
 */
export async function clearFence(
  tx: Executor,
  target: Pick<CleanupIdentity, 'runId' | 'uid' | 'runtimeScopeId' | 'sandboxId' | 'generation'>,
): Promise<string> {
  const { rows } = await tx.query<{ cleared: number; cleaned_at: string }>(CLEAR_FENCE, [
    target.runId,
    target.uid,
    target.runtimeScopeId,
    target.generation,
    target.sandboxId,
  ]);
  return new Date(rows[0]!.cleaned_at).toISOString();
}
