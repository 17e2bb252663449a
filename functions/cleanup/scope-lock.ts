import { RunNotFoundError } from './errors.ts';
import type { Executor } from './executor.ts';

/**
 * The scope's advisory transaction lock, the first lock every cleanup transaction takes (then
 * the run's row lock), in that order everywhere so two cleanups can never deadlock. The key is
 * the database's own `runtime_cleanup_lock_key`, so any other transaction of the platform takes
 * the very same lock.
 */
const LOCK_SCOPE = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';

/** Resolves the run's scope and locks it in one round trip (phase 1 does not know the scope yet). */
const LOCK_SCOPE_OF_RUN = `
  SELECT r.uid, r.runtime_scope_id, pg_advisory_xact_lock(runtime_cleanup_lock_key(r.uid, r.runtime_scope_id))
  FROM agent_runs r
  WHERE r.id = $1::text`;

export interface RuntimeScope {
  uid: string;
  runtimeScopeId: string;
}

export async function lockScope(tx: Executor, scope: RuntimeScope): Promise<void> {
  await tx.query(LOCK_SCOPE, [scope.uid, scope.runtimeScopeId]);
}

export async function lockScopeOfRun(tx: Executor, runId: string): Promise<RuntimeScope> {
  const { rows } = await tx.query<{ uid: string; runtime_scope_id: string }>(LOCK_SCOPE_OF_RUN, [runId]);
  const row = rows[0];
  if (!row) throw new RunNotFoundError(runId);
  return { uid: row.uid, runtimeScopeId: row.runtime_scope_id };
}
