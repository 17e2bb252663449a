/**
 * The worked example of docs/adopting.md, as the tests use it: the platform's own schema and the
 * adoption scripts under examples/adoption/, and the platform's side of the contract
 * (docs/integration.md, section 1, "What the platform does") written against that platform's own
 * columns (user_id, thread_id), as its Python code does in examples/python/.
 */
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type { Database, Executor } from '../../functions/adapters/database.ts';

export type AdoptionScript = 'platform-schema' | 'adopt' | 'record-live-sandboxes' | 'rollback';

export function adoptionScript(name: AdoptionScript): Promise<string> {
  return readFile(new URL(`../../examples/adoption/${name}.sql`, import.meta.url), 'utf8');
}

/** The platform derives a thread's sandbox id from the thread (examples/python/runtime_cleanup_contract.py). */
export function sandboxIdOf(threadId: string): string {
  return `sbx-${createHash('sha256').update(threadId).digest('hex').slice(0, 12)}`;
}

/** Step 2: the scope's lock in a statement of its own, then the insert only while not blocked. */
export async function admitRun(
  db: Database,
  run: { id: string; userId: string; threadId: string },
): Promise<boolean> {
  return db.withTransaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
      run.userId,
      run.threadId,
    ]);
    const { rows } = await tx.query(
      `INSERT INTO agent_runs (id, user_id, thread_id, status)
       SELECT $1::text, $2::text, $3::text, 'running'
       WHERE NOT runtime_cleanup_blocked($2::text, $3::text)
       RETURNING id`,
      [run.id, run.userId, run.threadId],
    );
    return rows.length === 1;
  });
}

/**
 * Step 3 with a provisioner that reports no generation: the platform's own counter, one up on
 * every record (`bump`), or, as a platform that forgets to count does, the same number again.
 */
export async function recordSandbox(
  db: Executor,
  scope: { userId: string; threadId: string; sandboxId: string },
  counting: 'bump' | 'same' = 'bump',
): Promise<number> {
  const next = counting === 'bump' ? 'sandbox_runtimes.generation + 1' : 'sandbox_runtimes.generation';
  const { rows } = await db.query<{ generation: string }>(
    `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
     VALUES ($1::text, $2::text, $3::text, 1)
     ON CONFLICT (uid, runtime_scope_id)
     DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = ${next}
     RETURNING generation`,
    [scope.userId, scope.threadId, scope.sandboxId],
  );
  return Number(rows[0]!.generation);
}

/**
 * Step 1: the terminal status and the fence in one statement; true when a fence was raised. As
 * finish_run.py, the statement asks the database's rule: a status that is not terminal changes
 * nothing (and raises no fence).
 */
export async function finishRun(db: Executor, runId: string, status = 'completed'): Promise<boolean> {
  const { rows } = await db.query<{ fenced: boolean }>(
    `UPDATE agent_runs SET status = $2::text, finished_at = now(), updated_at = now(),
            runtime_cleanup_pending = (run_type <> 'subagent')
     WHERE id = $1::text AND runtime_cleanup_status_is_terminal($2::text)
     RETURNING runtime_cleanup_pending AS fenced`,
    [runId, status],
  );
  return rows[0]?.fenced ?? false;
}
