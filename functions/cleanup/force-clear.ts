import { ErrorCode, OperationRefusedError, RunNotFoundError } from './errors.ts';
import type { Database } from './executor.ts';

/**
 * An operator's forced clear of a fence: the way out when a cleanup can never succeed (the
 * provisioner reports an impossible generation, the sandbox was destroyed out of band) and the
 * scope must be unblocked. It skips the confirmed delete and nothing else.
 *
 * The decision is the database's, as for the phases: ONE call of `runtime_cleanup_force_clear`
 * (infra/sql/runtime_cleanup_force_clear.sql, which says what it checks, what it deliberately does
 * not do, and why) in a one-round-trip transaction takes phase 1's locks, re-checks, and clears
 * the fence and writes the audit row together, or refuses. This module only validates the
 * operator's text and maps the verdict onto results and errors. A dry run makes the same call
 * without applying: same locks, same checks, nothing written.
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
 * One call of the decision function in a one-round-trip transaction (`Database.transact`): it
 * takes the locks, re-checks, and with `p_apply` clears the fence and writes the audit row.
 */
const FORCE_CLEAR = `
  SELECT verdict, uid, runtime_scope_id, status, fence_set_at, sandbox_id, generation::text AS generation,
         active_run_id, delete_in_flight_until, delete_in_flight_run_id, delete_in_flight_sandbox_id,
         delete_in_flight_generation::text AS delete_in_flight_generation, override_id::text AS override_id,
         forced_at
  FROM runtime_cleanup_force_clear($1::text, $2::text, $3::text, $4::boolean)`;

interface ForceClearRow {
  verdict: string;
  uid: string | null;
  runtime_scope_id: string | null;
  status: string | null;
  fence_set_at: string | null;
  sandbox_id: string | null;
  generation: string | null;
  active_run_id: string | null;
  delete_in_flight_until: string | null;
  delete_in_flight_run_id: string | null;
  delete_in_flight_sandbox_id: string | null;
  delete_in_flight_generation: string | null;
  override_id: string | null;
  forced_at: string | null;
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
  const { rows } = await db.transact<ForceClearRow>(FORCE_CLEAR, [runId, reason, actor, !request.dryRun]);
  const row = rows[0]!;
  if (row.verdict === 'run_not_found') throw new RunNotFoundError(runId);
  const context = { runId, uid: row.uid!, runtimeScopeId: row.runtime_scope_id! };
  const plan: ForceClearPlan = {
    ...context,
    status: row.status!,
    fenceSetAt: row.fence_set_at,
    sandboxId: row.sandbox_id,
    generation: row.generation === null ? null : Number(row.generation),
    reason,
    actor,
  };
  switch (row.verdict) {
    case 'run_not_root':
      throw new OperationRefusedError(
        ErrorCode.RUN_NOT_ROOT,
        `run ${JSON.stringify(runId)} is a subagent run; only root runs own a fence`,
        context,
      );
    case 'fence_not_pending':
      throw new OperationRefusedError(
        ErrorCode.FENCE_NOT_PENDING,
        `run ${JSON.stringify(runId)} has no pending fence; there is nothing to clear`,
        context,
      );
    case 'run_not_terminal':
      throw new OperationRefusedError(
        ErrorCode.RUN_NOT_TERMINAL,
        `run ${JSON.stringify(runId)} is still ${row.status}; its sandbox is in use`,
        { ...context, status: row.status },
      );
    case 'scope_active':
      throw new OperationRefusedError(
        ErrorCode.SCOPE_ACTIVE,
        `run ${JSON.stringify(row.active_run_id)} is active in the scope of run ${JSON.stringify(runId)}; its sandbox is in use`,
        { ...context, activeRunId: row.active_run_id },
      );
    case 'delete_in_flight': {
      const until = new Date(row.delete_in_flight_until!).toISOString();
      throw new OperationRefusedError(
        ErrorCode.DELETE_IN_FLIGHT,
        `a DELETE of sandbox ${row.delete_in_flight_sandbox_id} generation ${row.delete_in_flight_generation} ` +
          `(the release of run ${row.delete_in_flight_run_id}) may still be in flight at the provisioner until ${until}; ` +
          'clearing the fence now would let a new run be handed that sandbox while the DELETE can still remove it. ' +
          `Try again after ${until}, or once \`npm run ops -- explain ${runId}\` shows no delete in flight ` +
          '(if the delete succeeds, the fence clears by itself).',
        {
          ...context,
          deleteInFlightUntil: until,
          deleteInFlightRunId: row.delete_in_flight_run_id,
          sandboxId: row.delete_in_flight_sandbox_id,
          generation: Number(row.delete_in_flight_generation),
        },
      );
    }
    case 'would_clear':
      return { applied: false, plan };
    case 'cleared':
      return {
        applied: true,
        plan,
        overrideId: Number(row.override_id),
        forcedAt: new Date(row.forced_at!).toISOString(),
      };
  }
  throw new Error(`runtime_cleanup_force_clear returned an unknown verdict ${row.verdict}`);
}
