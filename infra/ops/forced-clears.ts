/**
 * Reading the audit of forced clears (table `runtime_cleanup_overrides`, written by
 * functions/cleanup/force-clear.ts): `fences --history` lists them all, `explain` those of one run.
 */
import type { Database, Executor } from '../../functions/adapters/database.ts';
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
 * operator whose `force-clear --yes` lost its answer runs it again within minutes; later, the same
 * command (a shell history re-run, say) is a new decision, and "no pending fence" is the truthful
 * answer: announcing `runtime-cleaned` again would be news to nobody and noise to the platform.
 */
export const EARLIER_ATTEMPT_WINDOW_SECONDS = 900;

/**
 * The forced clear a retry of `force-clear --yes` may find already done: this run's latest audit
 * row (no forced clear since), by the same actor with the same reason, within the window, with the
 * run's fence still clear AND not raised again since the forced clear: the run's
 * `runtime_cleanup_pending_since` is unset or still the cleared fence's (a trigger-bypassing
 * restore may leave it set), and nothing has written the run since the clear (`updated_at` is the
 * clear's own `now()`; a re-raise cleared again by finalize writes it later). What would make
 * forceClear refuse now is read too: whether the scope is blocked (`runtime_cleanup_blocked`: another
 * root run's fence, or a release's DELETE that may still be in flight), so the command refuses
 * rather than announce "cleaned" for a scope that is not. Publishing `runtime-cleaned` once more
 * for a recognised clear is harmless: consumers take it at least once.
 */
const EARLIER_ATTEMPT = `
  SELECT o.id::text AS id, o.uid, o.runtime_scope_id, o.sandbox_id, o.generation::text AS generation,
         to_json(o.fence_set_at) #>> '{}' AS fence_set_at, o.reason, o.actor,
         to_json(o.forced_at) #>> '{}' AS forced_at, r.status,
         runtime_cleanup_blocked(o.uid, o.runtime_scope_id) AS blocked,
         to_json(s.delete_in_flight_until) #>> '{}' AS delete_in_flight_until,
         s.delete_in_flight_run_id, s.delete_in_flight_sandbox_id,
         s.delete_in_flight_generation::text AS delete_in_flight_generation
  FROM runtime_cleanup_overrides o
  JOIN agent_runs r ON r.id = o.run_id
  LEFT JOIN sandbox_runtimes s
    ON s.uid = o.uid AND s.runtime_scope_id = o.runtime_scope_id AND s.delete_in_flight_until > now()
  WHERE o.run_id = $1::text
    AND o.id = (SELECT max(id) FROM runtime_cleanup_overrides WHERE run_id = $1::text)
    AND o.actor = $2::text AND o.reason = $3::text
    AND o.forced_at > now() - make_interval(secs => $4::int)
    AND NOT r.runtime_cleanup_pending
    AND (r.runtime_cleanup_pending_since IS NULL OR r.runtime_cleanup_pending_since = o.fence_set_at)
    AND r.updated_at <= o.forced_at`;

/** Why the scope is blocked now: a release's DELETE that may still land, or another fence. */
export type ScopeBlock =
  | {
      kind: 'delete_in_flight';
      until: string;
      releaseRunId: string | null;
      sandboxId: string | null;
      generation: number | null;
    }
  | { kind: 'fence_pending' };

export interface EarlierAttempt {
  overrideId: number;
  uid: string;
  runtimeScopeId: string;
  status: string;
  sandboxId: string | null;
  generation: number | null;
  fenceSetAt: string | null;
  forcedAt: string;
  /** Set when the scope is blocked now: the clear happened, but "cleaned" must not be announced. */
  blockedBy: ScopeBlock | null;
}

export async function findEarlierAttempt(
  db: Pick<Database, 'transact'>,
  request: { runId: string; actor: string; reason: string },
): Promise<EarlierAttempt | undefined> {
  // A read, in one READ COMMITTED trip (runtime_cleanup_blocked answers only at that level): safe
  // to send again after a lost connection.
  const { rows } = await db.transact<{
    id: string;
    uid: string;
    runtime_scope_id: string;
    sandbox_id: string | null;
    generation: string | null;
    fence_set_at: string | null;
    forced_at: string;
    status: string;
    blocked: boolean;
    delete_in_flight_until: string | null;
    delete_in_flight_run_id: string | null;
    delete_in_flight_sandbox_id: string | null;
    delete_in_flight_generation: string | null;
  }>(EARLIER_ATTEMPT, [request.runId, request.actor, request.reason, EARLIER_ATTEMPT_WINDOW_SECONDS]);
  const row = rows[0];
  if (!row) return undefined;
  const blockedBy: ScopeBlock | null =
    row.delete_in_flight_until !== null
      ? {
          kind: 'delete_in_flight',
          until: new Date(row.delete_in_flight_until).toISOString(),
          releaseRunId: row.delete_in_flight_run_id,
          sandboxId: row.delete_in_flight_sandbox_id,
          generation:
            row.delete_in_flight_generation === null ? null : Number(row.delete_in_flight_generation),
        }
      : row.blocked
        ? { kind: 'fence_pending' }
        : null;
  return {
    overrideId: Number(row.id),
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
    status: row.status,
    sandboxId: row.sandbox_id,
    generation: row.generation === null ? null : Number(row.generation),
    fenceSetAt: row.fence_set_at,
    forcedAt: row.forced_at,
    blockedBy,
  };
}
