import { ErrorCode, OperationRefusedError, RunNotFoundError } from './errors.ts';
import type { Database } from './executor.ts';
import { inspectRun, isTerminalStatus } from './inspect-run.ts';
import { lockScopeOfRun } from './scope-lock.ts';
import { RunType } from './types.ts';

/**
 * An operator's forced clear of a fence: the way out when a cleanup can never succeed (the
 * provisioner reports an impossible generation, the sandbox was destroyed out of band) and the
 * scope must be unblocked. It skips the confirmed delete and nothing else: one short transaction
 * with the same advisory lock and row lock as phases 1 and 3, the same re-checks (a terminal root
 * run, its fence up, no active run in the scope or below it), and then, in one statement, the
 * fence cleared, the scope's live generation marked released and an audit row written.
 *
 * Marking the generation released is what makes late messages harmless: a duplicate finalize
 * finds the fence clear (ALREADY_CLEAR) and a duplicate release deletes at most that generation,
 * which the provisioner refuses (409) once the scope has a newer one.
 */
export const FORCE_CLEAR_REASON_MAX_LENGTH = 500;
export const FORCE_CLEAR_ACTOR_MAX_LENGTH = 128;

export interface ForceClearRequest {
  runId: string;
  /** Why the operator clears the fence by hand; required, kept in the audit row. */
  reason: string;
  /** Who clears it (`--actor`, else the login name). */
  actor: string;
  /** Run every check under the locks, report what would be done, change nothing. */
  dryRun: boolean;
}

/** What a forced clear touches: the fence, and the generation that may still exist at the provisioner. */
export interface ForceClearPlan {
  runId: string;
  uid: string;
  runtimeScopeId: string;
  status: string;
  /** `runtime_cleanup_pending_since` of the fence being cleared. */
  fenceSetAt: string | null;
  /** The scope's live sandbox; null when it has none (nothing can be left behind). */
  sandboxId: string | null;
  generation: number | null;
  reason: string;
  actor: string;
}

export type ForceClearResult =
  | { applied: false; plan: ForceClearPlan }
  | { applied: true; plan: ForceClearPlan; overrideId: number; forcedAt: string };

/**
 * Clears the fence (only if still up), releases the captured sandbox (named by id and generation,
 * as in finalize: generations are counted per sandbox id) and records the override, in one
 * statement: either all three happen or none does.
 */
const FORCE_CLEAR = `
  WITH cleared AS (
    UPDATE agent_runs SET runtime_cleanup_pending = false, updated_at = now()
    WHERE id = $1::text AND runtime_cleanup_pending
    RETURNING id, uid, runtime_scope_id
  ),
  released AS (
    UPDATE sandbox_runtimes s SET released_at = now()
    FROM cleared c
    WHERE s.uid = c.uid AND s.runtime_scope_id = c.runtime_scope_id
      AND s.generation = $2::bigint AND s.sandbox_id = $3::text AND s.released_at IS NULL
    RETURNING s.generation
  )
  INSERT INTO runtime_cleanup_overrides
    (run_id, uid, runtime_scope_id, sandbox_id, generation, fence_set_at, reason, actor)
  SELECT c.id, c.uid, c.runtime_scope_id, $3::text, $2::bigint, $4::timestamptz, $5::text, $6::text
  FROM cleared c
  RETURNING id::text AS id, to_json(forced_at) #>> '{}' AS forced_at`;

/** NUL cannot be stored in PostgreSQL text; other control characters (tab, newline aside) would garble the audit. */
function hasControlCharacter(text: string): boolean {
  for (const char of text) {
    const code = char.codePointAt(0)!;
    if ((code < 0x20 && code !== 0x09 && code !== 0x0a) || code === 0x7f) return true;
  }
  return false;
}

/** Throws OperationRefusedError (REASON_INVALID) unless the text is usable as a reason or actor. */
function requireText(field: 'reason' | 'actor', value: string, maxLength: number): string {
  const text = value.trim();
  if (text.length === 0 || text.length > maxLength || hasControlCharacter(text)) {
    throw new OperationRefusedError(
      ErrorCode.REASON_INVALID,
      `a ${field} is required: non-empty, at most ${maxLength} characters, no control characters`,
      { field, length: text.length, maxLength },
    );
  }
  return text;
}

/**
 * Force-clears the fence of `runId`, or with `dryRun` only reports what it would do. Throws
 * RunNotFoundError, OperationRefusedError (REASON_INVALID, RUN_NOT_ROOT, FENCE_NOT_PENDING,
 * RUN_NOT_TERMINAL, SCOPE_ACTIVE; nothing changed) and database errors, DatabaseLockTimeoutError
 * among them when a cleanup holds the scope's lock longer than the lock timeout.
 */
export async function forceClear(db: Database, request: ForceClearRequest): Promise<ForceClearResult> {
  const reason = requireText('reason', request.reason, FORCE_CLEAR_REASON_MAX_LENGTH);
  const actor = requireText('actor', request.actor, FORCE_CLEAR_ACTOR_MAX_LENGTH);
  const { runId } = request;
  return db.withTransaction(async (tx) => {
    await lockScopeOfRun(tx, runId);
    const facts = await inspectRun(tx, runId);
    if (!facts) throw new RunNotFoundError(runId);
    const context = { runId, uid: facts.uid, runtimeScopeId: facts.runtimeScopeId };

    if (facts.runType === RunType.SUBAGENT) {
      throw new OperationRefusedError(
        ErrorCode.RUN_NOT_ROOT,
        `run ${JSON.stringify(runId)} is a subagent run; only root runs own a fence`,
        context,
      );
    }
    if (!facts.fencePending) {
      throw new OperationRefusedError(
        ErrorCode.FENCE_NOT_PENDING,
        `run ${JSON.stringify(runId)} has no pending fence; there is nothing to clear`,
        context,
      );
    }
    if (!isTerminalStatus(facts.status)) {
      throw new OperationRefusedError(
        ErrorCode.RUN_NOT_TERMINAL,
        `run ${JSON.stringify(runId)} is still ${facts.status}; its sandbox is in use`,
        { ...context, status: facts.status },
      );
    }
    if (facts.activeRunId) {
      throw new OperationRefusedError(
        ErrorCode.SCOPE_ACTIVE,
        `run ${JSON.stringify(facts.activeRunId)} is active in the scope of run ${JSON.stringify(runId)}; its sandbox is in use`,
        { ...context, activeRunId: facts.activeRunId },
      );
    }

    const plan: ForceClearPlan = {
      ...context,
      status: facts.status,
      fenceSetAt: facts.fenceSetAt,
      sandboxId: facts.liveSandbox?.sandboxId ?? null,
      generation: facts.liveSandbox?.generation ?? null,
      reason,
      actor,
    };
    if (request.dryRun) return { applied: false, plan };

    const { rows } = await tx.query<{ id: string; forced_at: string }>(FORCE_CLEAR, [
      runId,
      plan.generation,
      plan.sandboxId,
      plan.fenceSetAt,
      reason,
      actor,
    ]);
    // The row lock held since inspectRun keeps the fence up until here: one row is certain.
    const row = rows[0]!;
    return {
      applied: true,
      plan,
      overrideId: Number(row.id),
      forcedAt: new Date(row.forced_at).toISOString(),
    };
  });
}
