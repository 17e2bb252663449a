import { RunNotFoundError } from '../../functions/cleanup/errors.ts';
import type { Executor } from '../../functions/cleanup/executor.ts';

/**
 * The old design's lock, taken from TypeScript (the protocol's decision functions take the same
 * lock in SQL, infra/sql/): the run's scope resolved and its advisory transaction lock taken in
 * one round trip, before the run's row lock, the order every cleanup transaction keeps so that
 * two can never deadlock. The key is the database's own `runtime_cleanup_lock_key`, so any other
 * transaction of the platform takes the very same lock.
 */
const LOCK_SCOPE_OF_RUN = `
  SELECT r.uid, r.runtime_scope_id, pg_advisory_xact_lock(runtime_cleanup_lock_key(r.uid, r.runtime_scope_id))
  FROM agent_runs r
  WHERE r.id = $1::text`;

export interface RuntimeScope {
  uid: string;
  runtimeScopeId: string;
}

export async function lockScopeOfRun(tx: Executor, runId: string): Promise<RuntimeScope> {
  const { rows } = await tx.query<{ uid: string; runtime_scope_id: string }>(LOCK_SCOPE_OF_RUN, [runId]);
  const row = rows[0];
  if (!row) throw new RunNotFoundError(runId);
  return { uid: row.uid, runtimeScopeId: row.runtime_scope_id };
}
