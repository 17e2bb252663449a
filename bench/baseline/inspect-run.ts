import type { Executor } from '../../functions/cleanup/executor.ts';

/**
 * BASELINE FOR THE BENCHMARK ONLY: the facts the one-transaction baseline
 * (delete-inside-transaction.ts) decides on, read in one statement with the run row locked
 * (`FOR UPDATE`). Call it only with the scope's advisory lock held, so the facts cannot move until
 * commit.
 *
 * Naive on purpose (the design the ADR replaced decided in the client), but it redefines no rule:
 * terminal, "an active run in the scope or below the run" and "released" are the product's own SQL
 * functions (infra/sql/), called here as the decision functions call them.
 */
const INSPECT_RUN = `
  SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
         runtime_cleanup_status_is_terminal(r.status) AS terminal,
         c.uid AS conversation_uid, c.workdir_path,
         runtime_cleanup_active_run(r.uid, r.runtime_scope_id, r.id) AS active_run_id,
         s.sandbox_id, s.generation::text AS generation,
         runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                             s.sandbox_id, s.generation) AS sandbox_released
  FROM agent_runs r
  LEFT JOIN conversations c
    ON c.id = r.conversation_id OR (r.conversation_id IS NULL AND c.thread_id = r.conversation_thread_id)
  LEFT JOIN sandbox_runtimes s ON s.uid = r.uid AND s.runtime_scope_id = r.runtime_scope_id
  WHERE r.id = $1::text
  FOR UPDATE OF r`;

export interface RunFacts {
  uid: string;
  runtimeScopeId: string;
  runType: string;
  status: string;
  /** runtime_cleanup_status_is_terminal(status). */
  terminal: boolean;
  fencePending: boolean;
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
  terminal: boolean;
  conversation_uid: string | null;
  workdir_path: string | null;
  active_run_id: string | null;
  sandbox_id: string | null;
  generation: string | null;
  sandbox_released: boolean | null;
}

/** Returns undefined when the run does not exist. */
export async function inspectRun(tx: Executor, runId: string): Promise<RunFacts | undefined> {
  const { rows } = await tx.query<InspectRow>(INSPECT_RUN, [runId]);
  const row = rows[0];
  if (!row) return undefined;
  const live = row.sandbox_id !== null && row.generation !== null && !row.sandbox_released;
  return {
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
    runType: row.run_type,
    status: row.status,
    terminal: row.terminal,
    fencePending: row.runtime_cleanup_pending,
    conversationUid: row.conversation_uid,
    workdirPath: row.workdir_path,
    activeRunId: row.active_run_id,
    liveSandbox: live ? { sandboxId: row.sandbox_id!, generation: Number(row.generation) } : null,
  };
}
