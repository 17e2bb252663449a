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
 * run, its fence up, no active run in the scope or below it), no delete that may still be in
 * flight for the scope, and then, in one statement, this run's fence cleared and an audit row
 * written.
 *
 * What it does NOT do, and why:
 * - It does not mark the scope's sandbox generation released. Nothing confirmed that generation
 *   gone, and "released" is what lets a cleanup skip the delete: another fenced run of the same
 *   scope would then have been cleared as "nothing to delete" without its own audit row, and the
 *   sandbox left running. The generation stays live in the database; the next cleanup of the scope
 *   deletes it.
 * - It does not clear while a release's DELETE may still be in flight (the guard's record on the
 *   scope's sandbox row, see release-guard.ts): the platform would then admit a new run, the
 *   provisioner hand it the still-live sandbox, and the late DELETE remove it under the running run.
 *   The sandbox row is read FOR UPDATE, so a release guard that committed a record just before is
 *   seen, and one still writing is waited for.
 *
 * A late message of the cleared fence stays harmless: a stale release finds its fence gone in the
 * guard and sends nothing; a stale finalize finds the fence clear (ALREADY_CLEAR).
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
  /**
   * The scope's live sandbox generation, which may still exist at the provisioner (it stays
   * recorded as live); null when the scope has none.
   */
  sandboxId: string | null;
  generation: number | null;
  reason: string;
  actor: string;
}

export type ForceClearResult =
  | { applied: false; plan: ForceClearPlan }
  | { applied: true; plan: ForceClearPlan; overrideId: number; forcedAt: string };

/**
 * Clears the fence (only if still up) and records the override, in one statement: both happen or
 * neither does. The generation is recorded as it was live (it may still exist), not released.
 */
const FORCE_CLEAR = `
  WITH cleared AS (
    UPDATE agent_runs SET runtime_cleanup_pending = false, updated_at = now()
    WHERE id = $1::text AND runtime_cleanup_pending
    RETURNING id, uid, runtime_scope_id
  )
  INSERT INTO runtime_cleanup_overrides
    (run_id, uid, runtime_scope_id, sandbox_id, generation, fence_set_at, reason, actor)
  SELECT c.id, c.uid, c.runtime_scope_id, $3::text, $2::bigint, $4::timestamptz, $5::text, $6::text
  FROM cleared c
  RETURNING id::text AS id, to_json(forced_at) #>> '{}' AS forced_at`;

/**
 * The scope's sandbox row, locked: its live generation and any delete still in flight for it. Read
 * after the advisory lock, in its own statement, so it sees every record committed before.
 */
const LOCK_SCOPE_SANDBOX = `
  SELECT sandbox_id, generation::text AS generation, released_at IS NOT NULL AS released,
         delete_in_flight_until > clock_timestamp() AS delete_in_flight,
         to_json(delete_in_flight_until) #>> '{}' AS delete_in_flight_until,
         delete_in_flight_run_id, delete_in_flight_sandbox_id, delete_in_flight_generation::text AS delete_in_flight_generation
  FROM sandbox_runtimes
  WHERE uid = $1::text AND runtime_scope_id = $2::text
  FOR UPDATE`;

interface ScopeSandboxRow {
  sandbox_id: string;
  generation: string;
  released: boolean;
  delete_in_flight: boolean | null;
  delete_in_flight_until: string | null;
  delete_in_flight_run_id: string | null;
  delete_in_flight_sandbox_id: string | null;
  delete_in_flight_generation: string | null;
}

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
 * RUN_NOT_TERMINAL, SCOPE_ACTIVE, DELETE_IN_FLIGHT; nothing changed) and database errors, DatabaseLockTimeoutError
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

    const { rows: sandboxRows } = await tx.query<ScopeSandboxRow>(LOCK_SCOPE_SANDBOX, [
      facts.uid,
      facts.runtimeScopeId,
    ]);
    const sandbox = sandboxRows[0];
    if (sandbox?.delete_in_flight) {
      const until = new Date(sandbox.delete_in_flight_until!).toISOString();
      throw new OperationRefusedError(
        ErrorCode.DELETE_IN_FLIGHT,
        `a DELETE of sandbox ${sandbox.delete_in_flight_sandbox_id} generation ${sandbox.delete_in_flight_generation} ` +
          `(the release of run ${sandbox.delete_in_flight_run_id}) may still be in flight at the provisioner until ${until}; ` +
          'clearing the fence now would let a new run be handed that sandbox while the DELETE can still remove it. ' +
          `Try again after ${until}, or once \`npm run ops -- explain ${runId}\` shows no delete in flight ` +
          '(if the delete succeeds, the fence clears by itself).',
        {
          ...context,
          deleteInFlightUntil: until,
          deleteInFlightRunId: sandbox.delete_in_flight_run_id,
          sandboxId: sandbox.delete_in_flight_sandbox_id,
          generation: Number(sandbox.delete_in_flight_generation),
        },
      );
    }
    const live = sandbox && !sandbox.released ? sandbox : undefined;
    const plan: ForceClearPlan = {
      ...context,
      status: facts.status,
      fenceSetAt: facts.fenceSetAt,
      sandboxId: live?.sandbox_id ?? null,
      generation: live ? Number(live.generation) : null,
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
