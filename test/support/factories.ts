/**
 * Record factories: rows written the way the platform writes them, with only the contract's
 * columns (the protocol's own bookkeeping columns are filled in by the database).
 */
import { randomUUID } from 'node:crypto';
import type { Executor } from '../../functions/adapters/database.ts';

export interface Scenario {
  uid: string;
  runtimeScopeId: string;
  threadId: string;
  conversationId: number;
  workdirPath: string;
  rootRunId: string;
  sandboxId: string;
  generation: number;
}

export async function insertConversation(
  db: Executor,
  values: { uid: string; threadId?: string; workdirPath?: string },
): Promise<{ id: number; threadId: string; workdirPath: string }> {
  const threadId = values.threadId ?? `thread-${randomUUID()}`;
  const workdirPath = values.workdirPath ?? `projects/${randomUUID()}`;
  const { rows } = await db.query<{ id: string }>(
    'INSERT INTO conversations (uid, thread_id, workdir_path) VALUES ($1::text, $2::text, $3::text) RETURNING id',
    [values.uid, threadId, workdirPath],
  );
  return { id: Number(rows[0]!.id), threadId, workdirPath };
}

export async function insertRun(
  db: Executor,
  values: {
    id?: string;
    uid: string;
    conversationId: number | null;
    threadId: string;
    runtimeScopeId: string;
    runType?: string;
    createdByRunId?: string | null;
    status: string;
    fence?: boolean;
  },
): Promise<string> {
  const id = values.id ?? `run-${randomUUID()}`;
  await db.query(
    `INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, run_type,
       created_by_run_id, status, runtime_cleanup_pending, finished_at)
     VALUES ($1::text, $2::text, $3::bigint, $4::text, $5::text, $6::text, $7::text, $8::text, $9::boolean,
       CASE WHEN runtime_cleanup_status_is_terminal($8::text) THEN now() END)`,
    [
      id,
      values.uid,
      values.conversationId,
      values.threadId,
      values.runtimeScopeId,
      values.runType ?? 'chat',
      values.createdByRunId ?? null,
      values.status,
      values.fence ?? false,
    ],
  );
  return id;
}

/**
 * Another run of the scenario's user and conversation, in the scenario's scope unless
 * `runtimeScopeId` names another one (a subagent's own scope, say).
 */
export async function insertOtherRun(
  db: Executor,
  s: Pick<Scenario, 'uid' | 'conversationId' | 'threadId' | 'runtimeScopeId'>,
  values: {
    runtimeScopeId?: string;
    runType?: string;
    createdByRunId?: string | null;
    status: string;
    fence?: boolean;
  },
): Promise<string> {
  return insertRun(db, {
    uid: s.uid,
    conversationId: s.conversationId,
    threadId: s.threadId,
    ...values,
    runtimeScopeId: values.runtimeScopeId ?? s.runtimeScopeId,
  });
}

export async function upsertSandbox(
  db: Executor,
  values: { uid: string; runtimeScopeId: string; sandboxId: string; generation: number },
): Promise<void> {
  await db.query(
    `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
     VALUES ($1::text, $2::text, $3::text, $4::bigint)
     ON CONFLICT (uid, runtime_scope_id)
     DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = EXCLUDED.generation, released_at = NULL`,
    [values.uid, values.runtimeScopeId, values.sandboxId, values.generation],
  );
}

/** A terminal root run with its fence up and a live sandbox generation, as the platform leaves it. */
export async function finishedRootRun(
  db: Executor,
  overrides: { status?: string; generation?: number; sandboxId?: string; withSandbox?: boolean } = {},
): Promise<Scenario> {
  const uid = `user-${randomUUID().slice(0, 8)}`;
  const runtimeScopeId = `scope-${randomUUID().slice(0, 8)}`;
  const conversation = await insertConversation(db, { uid });
  const sandboxId = overrides.sandboxId ?? `sbx-${randomUUID().slice(0, 12)}`;
  const generation = overrides.generation ?? 1;
  if (overrides.withSandbox !== false)
    await upsertSandbox(db, { uid, runtimeScopeId, sandboxId, generation });
  const rootRunId = await insertRun(db, {
    uid,
    conversationId: conversation.id,
    threadId: conversation.threadId,
    runtimeScopeId,
    status: overrides.status ?? 'completed',
    fence: true,
  });
  return {
    uid,
    runtimeScopeId,
    threadId: conversation.threadId,
    conversationId: conversation.id,
    workdirPath: conversation.workdirPath,
    rootRunId,
    sandboxId,
    generation,
  };
}

export async function fenceOf(db: Executor, runId: string): Promise<boolean> {
  const { rows } = await db.query<{ runtime_cleanup_pending: boolean }>(
    'SELECT runtime_cleanup_pending FROM agent_runs WHERE id = $1::text',
    [runId],
  );
  if (!rows[0]) throw new Error(`no run ${runId}`);
  return rows[0].runtime_cleanup_pending;
}
