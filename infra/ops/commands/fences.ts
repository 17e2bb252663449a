/**
 * `fences`: the pending fences, oldest first, with the scope's live sandbox generation;
 * `fences --history`: the forced clears, newest first. Only root runs own a fence (a subagent's
 * flag blocks nothing: `runtime_cleanup_blocked` ignores it), so only they are listed.
 *
 * Oldest by the age the sweeper uses: from `runtime_cleanup_pending_since`, or, where a write
 * bypassed the trigger and left it NULL, from when the run finished (else its last update). The
 * rows come from an index in that order (migration 006); the total is a separate count of the
 * same partial index, not a window over every pending fence joined to its sandbox.
 */
import type { Executor } from '../../../functions/adapters/database.ts';
import { type Command, type CommandInput, limitOption } from '../command.ts';
import { listForcedClears, renderForcedClears } from '../forced-clears.ts';
import { formatAge, isoTime, orDash, plural, renderTable } from '../format.ts';

/** Exported, with the count below, for the plan tests (test/integration/fence-scale.test.ts). */
export const PENDING_FENCES = `
  SELECT r.id, r.uid, r.runtime_scope_id, r.run_type, r.status,
         r.runtime_cleanup_pending_since AS pending_since,
         extract(epoch FROM now() - coalesce(r.runtime_cleanup_pending_since, r.finished_at, r.updated_at))::float8
           AS age_seconds,
         r.runtime_cleanup_announced_at AS announced_at,
         s.sandbox_id, s.generation::text AS generation, s.released_at,
         runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                             s.sandbox_id, s.generation) AS released
  FROM agent_runs r
  LEFT JOIN sandbox_runtimes s ON s.uid = r.uid AND s.runtime_scope_id = r.runtime_scope_id
  WHERE r.runtime_cleanup_pending AND r.run_type <> 'subagent'
  ORDER BY coalesce(r.runtime_cleanup_pending_since, r.finished_at, r.updated_at), r.id
  LIMIT $1::int`;

export const COUNT_PENDING_FENCES = `
  SELECT count(*)::int AS total FROM agent_runs WHERE runtime_cleanup_pending AND run_type <> 'subagent'`;

const DEFAULT_LIMIT = 50;
const MAX_LIMIT = 10_000;

export interface PendingFence {
  runId: string;
  uid: string;
  runtimeScopeId: string;
  runType: string;
  status: string;
  pendingSince: string | null;
  ageSeconds: number | null;
  /** When the sweeper last announced the fence again (null: never, or not since it was raised). */
  lastAnnouncedAt: string | null;
  /**
   * The scope's sandbox row; `released` (runtime_cleanup_generation_released, the decisions' rule)
   * means that generation is already confirmed gone. `releasedAt` alone may be a stale mark.
   */
  sandbox: { sandboxId: string; generation: number; releasedAt: string | null; released: boolean } | null;
}

interface FenceRow {
  id: string;
  uid: string;
  runtime_scope_id: string;
  run_type: string;
  status: string;
  pending_since: Date | null;
  age_seconds: number | null;
  announced_at: Date | null;
  sandbox_id: string | null;
  generation: string | null;
  released_at: Date | null;
  released: boolean | null;
}

export async function listPendingFences(
  db: Executor,
  limit: number,
): Promise<{ fences: PendingFence[]; total: number }> {
  // A read: safe to send again after a lost connection (Database.query does, once).
  const { rows } = await db.query<FenceRow>(PENDING_FENCES, [limit]);
  const counted = await db.query<{ total: number }>(COUNT_PENDING_FENCES);
  return {
    total: counted.rows[0]!.total,
    fences: rows.map((row) => ({
      runId: row.id,
      uid: row.uid,
      runtimeScopeId: row.runtime_scope_id,
      runType: row.run_type,
      status: row.status,
      pendingSince: isoTime(row.pending_since),
      ageSeconds: row.age_seconds === null ? null : Math.round(row.age_seconds),
      lastAnnouncedAt: isoTime(row.announced_at),
      sandbox:
        row.sandbox_id !== null && row.generation !== null
          ? {
              sandboxId: row.sandbox_id,
              generation: Number(row.generation),
              releasedAt: isoTime(row.released_at),
              released: row.released === true,
            }
          : null,
    })),
  };
}

async function pending(input: CommandInput, db: Executor) {
  const limit = limitOption(input, DEFAULT_LIMIT, MAX_LIMIT);
  const { fences, total } = await listPendingFences(db, limit);
  const heading = total
    ? `${plural(total, 'pending fence')}, oldest first${total > fences.length ? ` (showing ${fences.length}; --limit for more)` : ''}`
    : 'No pending fences.';
  const table = renderTable(
    ['RUN', 'UID', 'SCOPE', 'STATUS', 'PENDING SINCE', 'AGE', 'SANDBOX', 'GEN', 'LAST ANNOUNCED'],
    fences.map((fence) => [
      fence.runId,
      fence.uid,
      fence.runtimeScopeId,
      fence.status,
      orDash(fence.pendingSince),
      formatAge(fence.ageSeconds),
      orDash(fence.sandbox?.sandboxId),
      fence.sandbox ? `${fence.sandbox.generation}${fence.sandbox.released ? ' (released)' : ''}` : '-',
      orDash(fence.lastAnnouncedAt),
    ]),
  );
  return {
    result: { fences, total, limit },
    text: fences.length ? `${heading}\n${table}` : heading,
  };
}

async function history(input: CommandInput, db: Executor) {
  const limit = limitOption(input, DEFAULT_LIMIT, MAX_LIMIT);
  const forcedClears = await listForcedClears(db, { limit });
  return {
    result: { forcedClears, limit },
    text: forcedClears.length
      ? `${plural(forcedClears.length, 'forced clear')}, newest first\n${renderForcedClears(forcedClears)}`
      : 'No forced clears.',
  };
}

export const fencesCommand: Command = {
  name: 'fences',
  arguments: [],
  summary: 'pending fences, oldest first (--history: forced clears, newest first)',
  options: {
    history: { type: 'boolean', description: 'list the forced clears (audit) instead of pending fences' },
    limit: { type: 'string', value: 'n', description: `rows to show (default ${DEFAULT_LIMIT})` },
  },
  async run(input, context) {
    const db = await context.database();
    return input.options.history ? history(input, db) : pending(input, db);
  },
};
