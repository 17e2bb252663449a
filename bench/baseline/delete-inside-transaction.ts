/**
 * BASELINE FOR THE BENCHMARK ONLY — NOT PART OF THE PROTOCOL, NEVER DEPLOYED.
 *
 * The design the ADR replaced (docs/design.md, "The problem"): one transaction takes the
 * scope's advisory lock and the run's row lock, checks, deletes the sandbox at the provisioner
 * while both locks are held, clears the fence and commits:
 *
 *   BEGIN; advisory lock; SELECT … FOR UPDATE; checks; DELETE at the provisioner; UPDATE fence; COMMIT
 *
 * It is built from the very same parts as the split protocol (the same lock statement, the same
 * rules: `inspectRun` reads them through the product's SQL functions; the same ProvisionerClient,
 * the same fence-clearing updates: clear-fence.ts), so the benchmark compares exactly one thing:
 * where the external delete happens.
 */

import type { Database } from '../../functions/adapters/database.ts';
import type { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { OwnershipConflictError, RunNotFoundError } from '../../functions/cleanup/errors.ts';
import { type ReleaseOutcome, RunType } from '../../functions/cleanup/types.ts';
import { clearFence } from './clear-fence.ts';
import { inspectRun } from './inspect-run.ts';
import { lockScopeOfRun } from './scope-lock.ts';

export const BaselineOutcome = {
  CLEARED: 'cleared',
  ALREADY_CLEAN: 'already_clean',
  NOT_OWNER: 'not_owner',
  DEFERRED: 'deferred',
} as const;
export type BaselineOutcome = (typeof BaselineOutcome)[keyof typeof BaselineOutcome];

export interface BaselineResult {
  outcome: BaselineOutcome;
  /** Set when a delete was sent (inside the transaction). */
  releaseOutcome?: ReleaseOutcome;
}

export interface BaselineOptions {
  client: ProvisionerClient;
  provisionerDeleteTimeoutMs: number;
}

export async function cleanupWithDeleteInsideTransaction(
  db: Database,
  runId: string,
  options: BaselineOptions,
): Promise<BaselineResult> {
  return db.withTransaction(async (tx) => {
    await lockScopeOfRun(tx, runId);
    const facts = await inspectRun(tx, runId);
    if (!facts) throw new RunNotFoundError(runId);
    if (facts.runType === RunType.SUBAGENT) return { outcome: BaselineOutcome.NOT_OWNER };
    if (!facts.fencePending) return { outcome: BaselineOutcome.ALREADY_CLEAN };
    if (!facts.terminal || facts.activeRunId) return { outcome: BaselineOutcome.DEFERRED };
    if (facts.conversationUid !== facts.uid || facts.workdirPath === null) {
      throw new OwnershipConflictError(`the conversation of run ${JSON.stringify(runId)} does not match`, {
        runId,
        reason: 'conversation_mismatch',
      });
    }

    let releaseOutcome: ReleaseOutcome | undefined;
    if (facts.liveSandbox) {
      // The defect being measured: both locks stay held for the whole HTTP delete.
      releaseOutcome = await options.client.deleteSandbox({
        sandboxId: facts.liveSandbox.sandboxId,
        generation: facts.liveSandbox.generation,
        deleteTimeoutMs: options.provisionerDeleteTimeoutMs,
      });
    }
    // The same two updates as finalize's (runtime_cleanup_finalize), so both designs clear alike.
    await clearFence(tx, {
      runId,
      uid: facts.uid,
      runtimeScopeId: facts.runtimeScopeId,
      sandboxId: facts.liveSandbox?.sandboxId ?? null,
      generation: facts.liveSandbox?.generation ?? null,
    });
    return { outcome: BaselineOutcome.CLEARED, ...(releaseOutcome ? { releaseOutcome } : {}) };
  });
}
