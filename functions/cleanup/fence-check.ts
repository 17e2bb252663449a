import { OwnershipConflictError, RunNotFoundError } from './errors.ts';
import type { Database } from './executor.ts';
import { DeferralReason, FenceCheckOutcome, type FenceCheckResult } from './types.ts';

/**
 * Phase 1 — fence check: ONE call of `runtime_cleanup_fence_check` (infra/sql/) in a
 * one-round-trip transaction (`Database.transact`). The function takes the scope's advisory lock
 * and the run's row lock, decides, and returns the decision with the identity phase 2 deletes and
 * phase 3 re-checks; the COMMIT travels in the same message, so no lock waits on the network or
 * on this process, and none outlives this function. The decision logic is the SQL function's;
 * this module only maps it onto the outcome types.
 *
 * Throws RunNotFoundError or OwnershipConflictError (non-retryable) and database errors
 * (retryable); every other situation is an outcome.
 */
const FENCE_CHECK = `
  SELECT decision, uid, runtime_scope_id, workdir_path, sandbox_id, generation::text AS generation,
         fence_set_at, blocking_run_id
  FROM runtime_cleanup_fence_check($1::text)`;

interface FenceCheckRow {
  decision: string;
  uid: string | null;
  runtime_scope_id: string | null;
  workdir_path: string | null;
  sandbox_id: string | null;
  generation: string | null;
  fence_set_at: string | null;
  blocking_run_id: string | null;
}

export async function fenceCheck(db: Database, runId: string): Promise<FenceCheckResult> {
  const { rows } = await db.transact<FenceCheckRow>(FENCE_CHECK, [runId]);
  const row = rows[0]!;
  switch (row.decision) {
    case 'run_not_found':
      throw new RunNotFoundError(runId);
    case 'not_owner':
      return { outcome: FenceCheckOutcome.NOT_OWNER, runId };
    case 'already_clean':
      return { outcome: FenceCheckOutcome.ALREADY_CLEAN, runId };
    case 'run_not_terminal':
      return {
        outcome: FenceCheckOutcome.DEFERRED,
        runId,
        reason: DeferralReason.RUN_NOT_TERMINAL,
        blockingRunId: row.blocking_run_id!,
      };
    case 'scope_active':
      return {
        outcome: FenceCheckOutcome.DEFERRED,
        runId,
        reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
        blockingRunId: row.blocking_run_id!,
      };
    case 'conversation_missing':
      throw new OwnershipConflictError(`the conversation of run ${JSON.stringify(runId)} does not exist`, {
        runId,
        reason: 'conversation_missing',
      });
    case 'conversation_uid_mismatch':
      throw new OwnershipConflictError(
        `the conversation of run ${JSON.stringify(runId)} belongs to another uid`,
        { runId, reason: 'conversation_uid_mismatch' },
      );
    case 'release_needed':
    case 'nothing_to_delete': {
      const identity = {
        runId,
        uid: row.uid!,
        runtimeScopeId: row.runtime_scope_id!,
        workdirPath: row.workdir_path!,
        sandboxId: row.sandbox_id,
        generation: row.generation === null ? null : Number(row.generation),
        fenceSetAt: row.fence_set_at,
      };
      return row.decision === 'release_needed'
        ? { outcome: FenceCheckOutcome.RELEASE_NEEDED, identity }
        : { outcome: FenceCheckOutcome.NOTHING_TO_DELETE, identity };
    }
  }
  throw new Error(`runtime_cleanup_fence_check returned an unknown decision ${row.decision}`);
}
