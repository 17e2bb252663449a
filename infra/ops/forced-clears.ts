/**
 * Reading the audit of forced clears (table `runtime_cleanup_overrides`, written by
 * functions/cleanup/force-clear.ts): `fences --history` lists them all, `explain` those of one run.
 */
import type { Executor } from '../../functions/adapters/database.ts';
import { isoTime, orDash, renderTable } from './format.ts';

const FORCED_CLEARS = `
  SELECT id::text AS id, run_id, uid, runtime_scope_id, sandbox_id, generation::text AS generation,
         fence_set_at, reason, actor, forced_at
  FROM runtime_cleanup_overrides
  WHERE $1::text IS NULL OR run_id = $1::text
  ORDER BY forced_at DESC, id DESC
  LIMIT $2::int`;

export interface ForcedClear {
  id: number;
  runId: string;
  uid: string;
  runtimeScopeId: string;
  /** The generation that was live when the fence was cleared: it may still exist. */
  sandboxId: string | null;
  generation: number | null;
  fenceSetAt: string | null;
  reason: string;
  actor: string;
  forcedAt: string;
}

interface OverrideRow {
  id: string;
  run_id: string;
  uid: string;
  runtime_scope_id: string;
  sandbox_id: string | null;
  generation: string | null;
  fence_set_at: Date | null;
  reason: string;
  actor: string;
  forced_at: Date;
}

/** Newest first; all runs, or only `runId`'s. */
export async function listForcedClears(
  db: Executor,
  options: { runId?: string; limit: number },
): Promise<ForcedClear[]> {
  // A read: safe to send again after a lost connection (Database.query does, once).
  const { rows } = await db.query<OverrideRow>(FORCED_CLEARS, [options.runId ?? null, options.limit]);
  return rows.map((row) => ({
    id: Number(row.id),
    runId: row.run_id,
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
    sandboxId: row.sandbox_id,
    generation: row.generation === null ? null : Number(row.generation),
    fenceSetAt: isoTime(row.fence_set_at),
    reason: row.reason,
    actor: row.actor,
    forcedAt: isoTime(row.forced_at)!,
  }));
}

export function renderForcedClears(clears: readonly ForcedClear[]): string {
  return renderTable(
    ['FORCED AT', 'RUN', 'UID', 'SCOPE', 'SANDBOX', 'GEN', 'ACTOR', 'REASON'],
    clears.map((clear) => [
      clear.forcedAt,
      clear.runId,
      clear.uid,
      clear.runtimeScopeId,
      orDash(clear.sandboxId),
      orDash(clear.generation),
      clear.actor,
      clear.reason,
    ]),
  );
}
