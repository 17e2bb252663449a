import type { Executor } from './executor.ts';
import { TERMINAL_RUN_STATUSES } from './types.ts';

/**
 * Locks the run row (`FOR UPDATE`) and reads, in the same statement, every fact a decision about
 * the run rests on (the operator's force-clear and the benchmarks' baseline use it; phases 1 and 3
 * decide inside PostgreSQL, migration 008): the fence, the run's own status, the first non-terminal run that shares its scope
 * or descends from it, its conversation's uid and Workdir, and the scope's sandbox generation.
 * Call it only with the scope's advisory lock held, so the facts cannot move until commit.
 *
 * Anything that is not a known terminal status counts as active: an unknown status must block a
 * delete, never allow one.
 */
const INSPECT_RUN = `
  WITH RECURSIVE run AS (
    SELECT id, uid, runtime_scope_id, run_type, status, runtime_cleanup_pending,
           to_json(runtime_cleanup_pending_since) #>> '{}' AS fence_set_at, conversation_id, conversation_thread_id
    FROM agent_runs
    WHERE id = $1::text
    FOR UPDATE
  ),
  descendants AS (
    SELECT a.id, a.status FROM agent_runs a WHERE a.created_by_run_id = $1::text
    UNION
    SELECT a.id, a.status FROM agent_runs a JOIN descendants d ON a.created_by_run_id = d.id
  )
  SELECT run.uid, run.runtime_scope_id, run.run_type, run.status, run.runtime_cleanup_pending,
         run.fence_set_at,
         c.uid AS conversation_uid, c.workdir_path,
         coalesce(
           (SELECT a.id FROM agent_runs a
             WHERE a.uid = run.uid AND a.runtime_scope_id = run.runtime_scope_id AND a.id <> run.id
               AND (a.status <> ALL ($2::text[]) OR a.status IS NULL)
             ORDER BY a.id LIMIT 1),
           (SELECT d.id FROM descendants d WHERE d.status <> ALL ($2::text[]) OR d.status IS NULL ORDER BY d.id LIMIT 1)
         ) AS active_run_id,
         s.sandbox_id, s.generation::text AS generation,
         runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                             s.sandbox_id, s.generation) AS sandbox_released
  FROM run
  LEFT JOIN conversations c
    ON c.id = run.conversation_id OR (run.conversation_id IS NULL AND c.thread_id = run.conversation_thread_id)
  LEFT JOIN sandbox_runtimes s ON s.uid = run.uid AND s.runtime_scope_id = run.runtime_scope_id`;

export interface RunFacts {
  uid: string;
  runtimeScopeId: string;
  runType: string;
  status: string;
  fencePending: boolean;
  fenceSetAt: string | null;
  /** Null when the conversation row is missing. */
  conversationUid: string | null;
  workdirPath: string | null;
  /** A non-terminal run (other than this one) in the scope, or a non-terminal descendant. */
  activeRunId: string | null;
  /** The scope's live sandbox, or null when it has none or its generation was already released. */
  liveSandbox: { sandboxId: string; generation: number } | null;
}

interface InspectRow {
  uid: string;
  runtime_scope_id: string;
  run_type: string;
  status: string;
  runtime_cleanup_pending: boolean;
  fence_set_at: string | null;
  conversation_uid: string | null;
  workdir_path: string | null;
  active_run_id: string | null;
  sandbox_id: string | null;
  generation: string | null;
  sandbox_released: boolean | null;
}

export function isTerminalStatus(status: string): boolean {
  return (TERMINAL_RUN_STATUSES as readonly string[]).includes(status);
}

/** Returns undefined when the run does not exist. */
export async function inspectRun(tx: Executor, runId: string): Promise<RunFacts | undefined> {
  const { rows } = await tx.query<InspectRow>(INSPECT_RUN, [runId, TERMINAL_RUN_STATUSES]);
  const row = rows[0];
  if (!row) return undefined;
  const live = row.sandbox_id !== null && row.generation !== null && !row.sandbox_released;
  return {
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
    runType: row.run_type,
    status: row.status,
    fencePending: row.runtime_cleanup_pending,
    fenceSetAt: row.fence_set_at,
    conversationUid: row.conversation_uid,
    workdirPath: row.workdir_path,
    activeRunId: row.active_run_id,
    liveSandbox: live ? { sandboxId: row.sandbox_id!, generation: Number(row.generation) } : null,
  };
}
