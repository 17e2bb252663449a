/**
 * The floor's two transactions (issue 15): the unavoidable database work of one cleanup with no
 * logic, each one round trip (`Database.transact`). Shared by the end-to-end floor
 * (`bench/e2e/floor.ts`) and part 1's floor row (`bench/locks/scenario.ts`), so both price the same
 * statements.
 *
 * Each notes when it took the scope's advisory lock (`runtime_cleanup_note_lock_taken`, installed
 * with the instrumented decision functions by instrumented-functions.ts), as those do, so its hold
 * is measured on the server's clock in the same way when the caller observes its transactions
 * (observed-transactions.ts).
 */
import type { Database } from '../../functions/adapters/database.ts';

/** Phase 1 of the floor: scope lock, row lock, the sandbox to delete. */
const FLOOR_CHECK = `
  SELECT r.uid, r.runtime_scope_id, s.sandbox_id, s.generation::text AS generation
  FROM agent_runs r
  JOIN sandbox_runtimes s ON s.uid = r.uid AND s.runtime_scope_id = r.runtime_scope_id
  CROSS JOIN LATERAL (
    SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key(r.uid, r.runtime_scope_id)), runtime_cleanup_note_lock_taken()
  ) AS locked
  WHERE r.id = $1::text
  FOR UPDATE OF r`;

/** Phase 3 of the floor: the same locks, the fence cleared, the generation marked released. */
const FLOOR_CLEAR = `
  WITH locked AS (
    SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($2::text, $3::text)), runtime_cleanup_note_lock_taken()
  ),
  run AS (
    UPDATE agent_runs SET runtime_cleanup_pending = false, updated_at = now()
    FROM locked WHERE id = $1::text RETURNING id
  )
  UPDATE sandbox_runtimes
  SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
  FROM run
  WHERE uid = $2::text AND runtime_scope_id = $3::text AND sandbox_id = $4::text AND generation = $5::bigint`;

/** What the floor's phase 1 reads and its phase 3 needs. */
export interface FloorTarget {
  runId: string;
  uid: string;
  runtimeScopeId: string;
  sandboxId: string;
  generation: string;
}

/** Phase 1: locks the scope and the run, reads the sandbox. Throws when the run has none. */
export async function floorCheck(db: Pick<Database, 'transact'>, runId: string): Promise<FloorTarget> {
  const { rows } = await db.transact<{
    uid: string;
    runtime_scope_id: string;
    sandbox_id: string;
    generation: string;
  }>(FLOOR_CHECK, [runId]);
  const row = rows[0];
  if (!row) throw new Error(`floor check: run ${runId} has no sandbox`);
  return {
    runId,
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
    sandboxId: row.sandbox_id,
    generation: row.generation,
  };
}

/** Phase 3: the same locks, the fence cleared, the generation marked released. */
export async function floorClear(db: Pick<Database, 'transact'>, target: FloorTarget): Promise<void> {
  await db.transact(FLOOR_CLEAR, [
    target.runId,
    target.uid,
    target.runtimeScopeId,
    target.sandboxId,
    target.generation,
  ]);
}
