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

/**
 * How long after a forced clear the same operator's retry is taken for a retry of that clear. An
 * operator whose `force-clear --yes` lost its answer runs it again within minutes; a day later
 * the same command is a new decision, and "no pending fence" is the truthful answer.
 */
export const EARLIER_ATTEMPT_WINDOW_SECONDS = 3_600;

/**
 * The forced clear a retry of `force-clear --yes` may find already done: this run's latest audit
 * row (no forced clear since), by the same actor with the same reason, within the window, with the
 * run's fence still clear. Publishing `runtime-cleaned` once more for it is harmless: consumers
 * take it at least once.
 */
const EARLIER_ATTEMPT = `
  SELECT o.id::text AS id, o.uid, o.runtime_scope_id, o.sandbox_id, o.generation::text AS generation,
         to_json(o.fence_set_at) #>> '{}' AS fence_set_at, o.reason, o.actor,
         to_json(o.forced_at) #>> '{}' AS forced_at, r.status
  FROM runtime_cleanup_overrides o
  JOIN agent_runs r ON r.id = o.run_id
  WHERE o.run_id = $1::text
    AND o.id = (SELECT max(id) FROM runtime_cleanup_overrides WHERE run_id = $1::text)
    AND o.actor = $2::text AND o.reason = $3::text
    AND o.forced_at > now() - make_interval(secs => $4::int)
    AND NOT r.runtime_cleanup_pending`;

export interface EarlierAttempt {
  overrideId: number;
  uid: string;
  runtimeScopeId: string;
  status: string;
  sandboxId: string | null;
  generation: number | null;
  fenceSetAt: string | null;
  forcedAt: string;
}

export async function findEarlierAttempt(
  db: Executor,
  request: { runId: string; actor: string; reason: string },
): Promise<EarlierAttempt | undefined> {
  // A read: safe to send again after a lost connection.
  const { rows } = await db.query<{
    id: string;
    uid: string;
    runtime_scope_id: string;
    sandbox_id: string | null;
    generation: string | null;
    fence_set_at: string | null;
    forced_at: string;
    status: string;
  }>(EARLIER_ATTEMPT, [request.runId, request.actor, request.reason, EARLIER_ATTEMPT_WINDOW_SECONDS]);
  const row = rows[0];
  if (!row) return undefined;
  return {
    overrideId: Number(row.id),
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
    status: row.status,
    sandboxId: row.sandbox_id,
    generation: row.generation === null ? null : Number(row.generation),
    fenceSetAt: row.fence_set_at,
    forcedAt: row.forced_at,
  };
}
