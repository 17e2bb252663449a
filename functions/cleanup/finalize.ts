import { RunNotFoundError } from './errors.ts';
import type { Database } from './executor.ts';
import { type CleanupIdentity, DeferralReason, FinalizeOutcome, type FinalizeResult } from './types.ts';

/**
 * Phase 3 — finalize, after a confirmed delete (or when there was nothing to delete): ONE call of
 * `runtime_cleanup_finalize` (infra/sql/) in a one-round-trip transaction. Under the scope's
 * advisory lock and the run's row lock it re-checks everything the delete relied on (the fence is
 * the one phase 1 saw, no run is active in the scope, the Workdir and the scope's sandbox
 * generation are unchanged, no delete is still in flight for the scope) and only then clears the
 * fence and marks the generation released, naming it. Otherwise the fence stays and the outcome
 * says why; the caller defers or restarts at phase 1.
 *
 * Concurrent finalizes of one run converge: the first clears, the rest see ALREADY_CLEAR.
 */
const FINALIZE = `
  SELECT decision, blocking_run_id, changed, cleaned_at
  FROM runtime_cleanup_finalize($1::text, $2::text, $3::text, $4::text, $5::text, $6::bigint, $7::text)`;

interface FinalizeRow {
  decision: string;
  blocking_run_id: string | null;
  changed: string[] | null;
  cleaned_at: string | null;
}

export async function finalize(db: Database, identity: CleanupIdentity): Promise<FinalizeResult> {
  const { rows } = await db.transact<FinalizeRow>(FINALIZE, [
    identity.runId,
    identity.uid,
    identity.runtimeScopeId,
    identity.workdirPath,
    identity.sandboxId,
    identity.generation,
    identity.fenceSetAt,
  ]);
  const row = rows[0]!;
  switch (row.decision) {
    case 'run_not_found':
      throw new RunNotFoundError(identity.runId);
    case 'already_clear':
      return { outcome: FinalizeOutcome.ALREADY_CLEAR };
    case 'identity_changed':
      return { outcome: FinalizeOutcome.IDENTITY_CHANGED, changed: row.changed ?? [] };
    case 'run_not_terminal':
      return {
        outcome: FinalizeOutcome.DEFERRED,
        reason: DeferralReason.RUN_NOT_TERMINAL,
        blockingRunId: row.blocking_run_id!,
      };
    case 'scope_active':
      return {
        outcome: FinalizeOutcome.DEFERRED,
        reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
        blockingRunId: row.blocking_run_id!,
      };
    case 'delete_in_flight':
      return {
        outcome: FinalizeOutcome.DEFERRED,
        reason: DeferralReason.DELETE_IN_FLIGHT,
        blockingRunId: row.blocking_run_id ?? identity.runId,
      };
    case 'cleared':
      return { outcome: FinalizeOutcome.CLEARED, cleanedAt: new Date(row.cleaned_at!).toISOString() };
  }
  throw new Error(`runtime_cleanup_finalize returned an unknown decision ${row.decision}`);
}
