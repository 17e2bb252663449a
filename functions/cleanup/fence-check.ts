import { OwnershipConflictError, RunNotFoundError } from './errors.ts';
import type { Database } from './executor.ts';
import { inspectRun, isTerminalStatus } from './inspect-run.ts';
import { lockScopeOfRun } from './scope-lock.ts';
import { DeferralReason, FenceCheckOutcome, type FenceCheckResult, RunType } from './types.ts';

/**
 * Phase 1 — fence check, one short transaction: the scope's advisory lock, the run's row lock,
 * then a decision. It resolves the identity phase 2 deletes and phase 3 re-checks, and commits
 * before anything external is called, so no lock outlives this function.
 *
 * Throws RunNotFoundError or OwnershipConflictError (non-retryable) and database errors
 * (retryable); every other situation is an outcome.
 */
export async function fenceCheck(db: Database, runId: string): Promise<FenceCheckResult> {
  return db.withTransaction(async (tx) => {
    await lockScopeOfRun(tx, runId);
    const facts = await inspectRun(tx, runId);
    // The row can vanish between the two statements only if it was deleted: same answer.
    if (!facts) throw new RunNotFoundError(runId);

    if (facts.runType === RunType.SUBAGENT) return { outcome: FenceCheckOutcome.NOT_OWNER, runId };
    if (!facts.fencePending) return { outcome: FenceCheckOutcome.ALREADY_CLEAN, runId };
    if (!isTerminalStatus(facts.status)) {
      return {
        outcome: FenceCheckOutcome.DEFERRED,
        runId,
        reason: DeferralReason.RUN_NOT_TERMINAL,
        blockingRunId: runId,
      };
    }
    if (facts.activeRunId) {
      return {
        outcome: FenceCheckOutcome.DEFERRED,
        runId,
        reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
        blockingRunId: facts.activeRunId,
      };
    }
    if (facts.conversationUid === null || facts.workdirPath === null) {
      throw new OwnershipConflictError(`the conversation of run ${JSON.stringify(runId)} does not exist`, {
        runId,
        reason: 'conversation_missing',
      });
    }
    if (facts.conversationUid !== facts.uid) {
      throw new OwnershipConflictError(
        `the conversation of run ${JSON.stringify(runId)} belongs to another uid`,
        {
          runId,
          reason: 'conversation_uid_mismatch',
        },
      );
    }
    const identity = {
      runId,
      uid: facts.uid,
      runtimeScopeId: facts.runtimeScopeId,
      workdirPath: facts.workdirPath,
      sandboxId: facts.liveSandbox?.sandboxId ?? null,
      generation: facts.liveSandbox?.generation ?? null,
      fenceSetAt: facts.fenceSetAt,
    };
    return facts.liveSandbox
      ? { outcome: FenceCheckOutcome.RELEASE_NEEDED, identity }
      : { outcome: FenceCheckOutcome.NOTHING_TO_DELETE, identity };
  });
}
