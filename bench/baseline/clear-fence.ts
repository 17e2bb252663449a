/**
 * The baseline's last write (bench/baseline/delete-inside-transaction.ts), kept here because only
 * the baseline uses it: the baseline deliberately models the OLD design, whose cleanup cleared
 * the fence with its own statement inside the transaction that had just deleted the sandbox. The
 * product no longer has such a statement: its finalize makes the same two updates inside
 * `runtime_cleanup_finalize` (infra/sql/runtime_cleanup_finalize.sql), after re-checking under
 * its locks. If those updates change, change these with them, or the two designs stop clearing
 * alike and the benchmark compares more than where the delete happens.
 */
import type { Executor } from '../../functions/adapters/database.ts';
import type { CleanupIdentity } from '../../functions/cleanup/types.ts';

/**
 * Clears the fence and marks the captured generation released (naming it), in one statement. The
 * fence is cleared only if it is still up; the generation only if it is still the captured one.
 */
const CLEAR_FENCE = `
  WITH cleared AS (
    UPDATE agent_runs SET runtime_cleanup_pending = false, updated_at = now()
    WHERE id = $1::text AND runtime_cleanup_pending
    RETURNING id
  ),
  released AS (
    UPDATE sandbox_runtimes
    SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
    WHERE uid = $2::text AND runtime_scope_id = $3::text AND generation = $4::bigint AND sandbox_id = $5::text
      AND NOT runtime_cleanup_generation_released(released_at, released_sandbox_id, released_generation,
                                                  sandbox_id, generation)
      AND EXISTS (SELECT 1 FROM cleared)
    RETURNING generation
  )
  SELECT (SELECT count(*) FROM cleared)::int AS cleared, to_json(now()) #>> '{}' AS cleaned_at`;

/**
 * The write of the old design's last step, for a caller that holds the scope's advisory lock and
 * the run's row lock and has re-checked everything. Returns when it happened (ISO).
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
