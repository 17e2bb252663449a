/**
 * docs/adopting.md, tried as the adopting team would: a new database holding the platform's own
 * schema (examples/adoption/platform-schema.sql: user_id and thread_id, naive times, no
 * sandbox_runtimes) and its rows, finished runs and a live one. `npm run migrate` refuses it,
 * naming what to map; after examples/adoption/adopt.sql it migrates, the live sandbox is recorded,
 * and the live run's cleanup converges through the local stack (the fence the platform raised is
 * seen by fence-check and cleared by finalize, the sandbox deleted). The platform's side runs
 * against its own columns and counts the generation itself; the provisioner ignores the generation
 * on DELETE (the local one in platform mode; test/platform/python-examples.test.ts runs the same
 * path against a FastAPI provisioner that reports none at all).
 * Last, examples/adoption/rollback.sql gives the platform its tables back, rows included.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { announceRunFinished } from '../../functions/adapters/publish.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { migrate } from '../../infra/migrate.ts';
import { readRunFacts } from '../../infra/ops/run-facts.ts';
import {
  admitRun,
  adoptionScript,
  finishRun,
  recordSandbox,
  sandboxIdOf,
} from '../support/adopted-platform.ts';
import { runChild } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { REPO_ROOT } from '../support/docs.ts';
import { fenceOf } from '../support/factories.ts';
import { rejectionOf } from '../support/probes.ts';
import { letTimePass } from '../support/reclaim-time.ts';
import { eventually, fencesCleared, startTestStack, type TestStack } from '../support/stack.ts';

const USER = 'user-7';
const FINISHED_THREAD = 'thread-finished';
const LIVE_THREAD = 'thread-live';
const LIVE_RUN = 'run-live';
const GRACE_SECONDS = 60;

/** The platform's rows as its API and worker wrote them, times naive and in UTC. */
const PLATFORM_ROWS = `
  INSERT INTO threads (id, user_id, project_id, created_at) VALUES
    ('${FINISHED_THREAD}', '${USER}', '11111111-1111-4111-8111-111111111111', '2026-11-30 08:00:00'),
    ('${LIVE_THREAD}', '${USER}', '22222222-2222-4222-8222-222222222222', '2026-11-30 08:30:00');
  INSERT INTO agent_runs (id, user_id, thread_id, parent_run_id, status, created_at, updated_at, finished_at) VALUES
    ('run-done-1', '${USER}', '${FINISHED_THREAD}', NULL, 'completed', '2026-11-30 09:00:00', '2026-11-30 09:05:00', '2026-11-30 09:05:00'),
    ('run-done-2', '${USER}', '${FINISHED_THREAD}', NULL, 'failed', '2026-11-30 10:00:00', '2026-11-30 10:01:00', '2026-11-30 10:01:00'),
    ('run-done-child', '${USER}', '${FINISHED_THREAD}', 'run-done-2', 'cancelled', '2026-11-30 10:00:30', '2026-11-30 10:01:00', '2026-11-30 10:01:00'),
    ('run-earlier', '${USER}', '${LIVE_THREAD}', NULL, 'completed', '2026-11-30 11:00:00', '2026-11-30 11:02:00', '2026-11-30 11:02:00'),
    ('${LIVE_RUN}', '${USER}', '${LIVE_THREAD}', NULL, 'running', '2026-11-30 12:00:00', '2026-11-30 12:00:00', NULL);`;

/** The shape of the platform's agent_runs: what rollback.sql must give back. */
const COLUMNS = `
  SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns
  WHERE table_schema = current_schema() AND table_name = 'agent_runs' ORDER BY ordinal_position`;
const ROWS = `SELECT id, user_id, thread_id, parent_run_id, status, created_at::text, updated_at::text,
                     finished_at::text FROM agent_runs WHERE id <> ALL ($1::text[]) ORDER BY id`;

let t: TestDatabase;
let stack: TestStack | undefined;
const runsAfterCutOver: string[] = [];
let platformColumns: unknown[];
let platformRows: unknown[];

beforeAll(async () => {
  t = await createTestDatabase({ empty: true });
  await t.db.query(await adoptionScript('platform-schema'));
  await t.db.query(PLATFORM_ROWS);
  platformColumns = (await t.db.query(COLUMNS)).rows;
  platformRows = (await t.db.query(ROWS, [[]])).rows;
});
afterAll(async () => {
  await stack?.stop();
  await t?.drop();
});

async function tableExists(name: string): Promise<boolean> {
  const { rows } = await t.db.query<{ found: boolean }>('SELECT to_regclass($1::text) IS NOT NULL AS found', [
    name,
  ]);
  return rows[0]!.found;
}

/** The stack's provisioner, as the platform calls it: POST, and any generation in the answer ignored. */
async function createSandbox(threadId: string): Promise<string> {
  const sandboxId = sandboxIdOf(threadId);
  const response = await fetch(`${stack!.provisionerUrl}/api/sandboxes`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: threadId, user_id: USER }),
  });
  expect(response.ok).toBe(true);
  return sandboxId;
}

const live = (sandboxId: string) => stack!.provisioner!.sandbox(sandboxId) !== undefined;

/** Finishes a run as the worker does (fence and status in one statement), then announces it. */
async function finishAndAnnounce(runId: string): Promise<void> {
  expect(await finishRun(t.db, runId)).toBe(true);
  await announceRunFinished(stack!.queues, runId);
}

describe('the platform schema, before adoption', () => {
  it('is refused by migrate, naming every column to map, and nothing is applied', async () => {
    const refusal = String(await rejectionOf(migrate(t.db)));

    expect(refusal).toContain('agent_runs has no column uid, conversation_id, conversation_thread_id');
    expect(refusal).toContain(
      'agent_runs.finished_at is timestamp without time zone, not timestamp with time zone',
    );
    expect(refusal).toContain('docs/adopting.md');
    expect(refusal).not.toContain('threads');
    expect(await tableExists('schema_migrations')).toBe(false);
    expect(await tableExists('sandbox_runtimes')).toBe(false);
  });

  it('`npm run migrate` says so and exits 1', async () => {
    const run = await runChild('npm', ['run', '--silent', 'migrate'], {
      cwd: REPO_ROOT,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME ?? '/tmp',
        DATABASE_URL: t.url,
        DATABASE_DRIVER: 'tcp',
      },
      timeoutMs: 60_000,
    });

    expect(run.code).toBe(1);
    expect(run.stderr).toContain('migrate failed (');
    expect(run.stderr).toContain('agent_runs has no column uid');
    expect(await tableExists('schema_migrations')).toBe(false);
  });

  it("would otherwise fail at migration 006: a fence's age over naive times cannot be indexed", async () => {
    const refusal = await rejectionOf(
      t.db.withTransaction(async (tx) => {
        await tx.query('CREATE TEMP TABLE naive (pending_since timestamptz, finished_at timestamp)');
        await tx.query('CREATE INDEX ON naive ((coalesce(pending_since, finished_at)))');
      }),
    );
    expect(String(refusal)).toContain('functions in index expression must be marked IMMUTABLE');
  });
});

describe('adopt.sql, then migrate', () => {
  beforeAll(async () => {
    await t.db.query(await adoptionScript('adopt'));
  });

  it('migrates, and the platform keeps writing only its own columns', async () => {
    expect((await migrate(t.db)).length).toBeGreaterThan(0);
    const { rows } = await t.db.query(
      `SELECT id, uid, conversation_thread_id, runtime_scope_id, run_type, created_by_run_id,
              runtime_cleanup_pending AS fenced, (finished_at AT TIME ZONE 'UTC')::text AS finished_utc
       FROM agent_runs WHERE id IN ('run-done-1', 'run-done-child') ORDER BY id`,
    );
    expect(rows).toEqual([
      {
        id: 'run-done-1',
        uid: USER,
        conversation_thread_id: FINISHED_THREAD,
        runtime_scope_id: FINISHED_THREAD,
        run_type: 'chat',
        created_by_run_id: null,
        fenced: false,
        finished_utc: '2026-11-30 09:05:00',
      },
      {
        id: 'run-done-child',
        uid: USER,
        conversation_thread_id: FINISHED_THREAD,
        runtime_scope_id: FINISHED_THREAD,
        run_type: 'subagent',
        created_by_run_id: 'run-done-2',
        fenced: false,
        finished_utc: '2026-11-30 10:01:00',
      },
    ]);
    expect(await migrate(t.db)).toEqual([]);
  });

  it('the old default, stored as an instant, was read in the session time zone; the new one is the instant', async () => {
    const { rows } = await t.db.withTransaction(async (tx) => {
      await tx.query("SET LOCAL TimeZone = 'America/New_York'");
      const old = await tx.query<{ hours: number }>(
        "SELECT extract(epoch FROM (now() AT TIME ZONE 'utc')::timestamptz - now())::float8 / 3600 AS hours",
      );
      expect(old.rows[0]!.hours).toBe(5);
      await tx.query(
        `INSERT INTO agent_runs (id, user_id, thread_id, status) VALUES ('run-default-time', '${USER}', '${FINISHED_THREAD}', 'cancelled')`,
      );
      return tx.query<{ skew: number }>(
        `SELECT abs(extract(epoch FROM created_at - now()))::float8 AS skew FROM agent_runs WHERE id = 'run-default-time'`,
      );
    });
    runsAfterCutOver.push('run-default-time');
    expect(rows[0]!.skew).toBeLessThan(60);
  });

  it('the statuses the contract counts as active are the live run’s alone', async () => {
    const { rows } = await t.db.query(
      `SELECT status, count(*)::int AS runs FROM agent_runs
       WHERE runtime_cleanup_status_is_active(status) GROUP BY status`,
    );
    expect(rows).toEqual([{ status: 'running', runs: 1 }]);
  });

  it('the conversation is found by thread id, with its Workdir', async () => {
    const { rows } = await t.db.query('SELECT * FROM runtime_cleanup_fence_check($1::text)', ['run-done-1']);
    // Not fenced: a run that finished before the cut-over is never cleaned up by the project.
    expect(rows[0]).toMatchObject({
      decision: 'already_clean',
      uid: USER,
      runtime_scope_id: FINISHED_THREAD,
    });
    const conversation = await t.db.query(`SELECT * FROM conversations WHERE thread_id = '${LIVE_THREAD}'`);
    expect(conversation.rows).toEqual([
      {
        id: null,
        uid: USER,
        thread_id: LIVE_THREAD,
        workdir_path: 'projects/22222222-2222-4222-8222-222222222222',
      },
    ]);
  });

  it('record-live-sandboxes.sql records the sandbox of the thread with a live run, and only that', async () => {
    await t.db.query(await adoptionScript('record-live-sandboxes'));
    await t.db.query(await adoptionScript('record-live-sandboxes'));
    const { rows } = await t.db.query(
      'SELECT uid, runtime_scope_id, sandbox_id, generation::int FROM sandbox_runtimes',
    );
    expect(rows).toEqual([
      { uid: USER, runtime_scope_id: LIVE_THREAD, sandbox_id: sandboxIdOf(LIVE_THREAD), generation: 1 },
    ]);
  });
});

describe('the cut-over: the cleanup of the live run converges', () => {
  beforeAll(async () => {
    stack = await startTestStack(t, {
      env: { RECLAIM_GRACE_SECONDS: String(GRACE_SECONDS) },
      stack: { provisionerMode: 'platform', reclaimer: false },
    });
    // The sandboxes the platform created before the cut-over: the live run's, and the idle one of
    // a finished thread, which no row names.
    await createSandbox(LIVE_THREAD);
    await createSandbox(FINISHED_THREAD);
  });

  it('the fence blocks the thread until finalize clears it; the sandbox is deleted', async () => {
    const sandboxId = sandboxIdOf(LIVE_THREAD);
    expect(await finishRun(t.db, LIVE_RUN)).toBe(true);
    expect(await admitRun(t.db, { id: 'run-too-early', userId: USER, threadId: LIVE_THREAD })).toBe(false);

    await announceRunFinished(stack!.queues, LIVE_RUN);
    await fencesCleared(t.db, [LIVE_RUN]);

    expect(live(sandboxId)).toBe(false);
    const cleaned = await eventually('runtime-cleaned for the live run', async () => {
      const messages = await stack!.drain(QueueName.RUNTIME_CLEANED);
      return messages.map((message) => JSON.parse(message.Body!)).find((body) => body.runId === LIVE_RUN);
    });
    expect(cleaned).toMatchObject({ uid: USER, runtimeScopeId: LIVE_THREAD, generation: 1 });
    const deletes = stack!.provisioner!.audit().filter((entry) => entry.method === 'DELETE');
    expect(deletes.map((entry) => entry.sandboxId)).toEqual([sandboxId]);
    // The finished thread's sandbox is no cleanup's: left to the reclaimer (off here).
    expect(live(sandboxIdOf(FINISHED_THREAD))).toBe(true);
  });

  it("the facts `npm run ops -- explain` shows of the cleaned run come from the platform's tables", async () => {
    const facts = await readRunFacts(t.db, LIVE_RUN);

    expect(facts.run).toMatchObject({
      uid: USER,
      runtimeScopeId: LIVE_THREAD,
      runType: 'chat',
      status: 'completed',
      terminal: true,
      fencePending: false,
      workdirPath: 'projects/22222222-2222-4222-8222-222222222222',
      createdAt: '2026-11-30T12:00:00.000Z',
    });
    expect(facts.scope).toMatchObject({ blocked: false, sandbox: { generation: 1, released: true } });
  });

  it('the next run of the thread is admitted; its sandbox, counted one up, is deleted in turn', async () => {
    const runId = `run-${randomUUID()}`;
    runsAfterCutOver.push(runId);
    expect(await admitRun(t.db, { id: runId, userId: USER, threadId: LIVE_THREAD })).toBe(true);
    const sandboxId = await createSandbox(LIVE_THREAD);
    expect(await recordSandbox(t.db, { userId: USER, threadId: LIVE_THREAD, sandboxId })).toBe(2);

    await finishAndAnnounce(runId);
    await fencesCleared(t.db, [runId]);

    expect(live(sandboxId)).toBe(false);
  });

  it('recorded again under the same generation, the new container is taken as released and left running', async () => {
    const runId = `run-${randomUUID()}`;
    runsAfterCutOver.push(runId);
    expect(await admitRun(t.db, { id: runId, userId: USER, threadId: LIVE_THREAD })).toBe(true);
    const sandboxId = await createSandbox(LIVE_THREAD);
    expect(await recordSandbox(t.db, { userId: USER, threadId: LIVE_THREAD, sandboxId }, 'same')).toBe(2);

    await finishAndAnnounce(runId);
    await fencesCleared(t.db, [runId]);

    // "Nothing to delete": generation 2 was released already, so the fence cleared without a DELETE.
    expect(live(sandboxId)).toBe(true);
    expect(await fenceOf(t.db, runId)).toBe(false);
  });
});

describe('the cut-over: sandboxes no cleanup owns', () => {
  it('the reclaimer deletes them once they looked leaked for the grace', async () => {
    // The finished thread's idle sandbox, named by no row, and the container recorded under a
    // generation already released (above), which no cleanup will delete.
    const idle = sandboxIdOf(FINISHED_THREAD);
    const keptAfterRelease = sandboxIdOf(LIVE_THREAD);
    expect(await stack!.runReclaimer()).toMatchObject({ leaked: 2, reclaimed: 0 });
    expect(live(idle) && live(keptAfterRelease)).toBe(true);

    await letTimePass(t.db, GRACE_SECONDS + 1);
    try {
      expect(await stack!.runReclaimer()).toMatchObject({ reclaimed: 2 });
    } finally {
      // Time back where it was, so the rollback below compares the rows as the platform wrote them.
      await letTimePass(t.db, -(GRACE_SECONDS + 1));
    }

    expect(live(idle) || live(keptAfterRelease)).toBe(false);
  });
});

describe('rollback.sql', () => {
  it("gives the platform back its tables and rows as they were, the cleanup's objects gone", async () => {
    await stack?.stop();
    stack = undefined;

    await t.db.query(await adoptionScript('rollback'));

    expect((await t.db.query(COLUMNS)).rows).toEqual(platformColumns);
    const untouched = (platformRows as Array<{ id: string }>).filter((row) => row.id !== LIVE_RUN);
    expect((await t.db.query(ROWS, [[LIVE_RUN, ...runsAfterCutOver]])).rows).toEqual(untouched);
    // The run finished during the cut-over: its time naive again, in UTC.
    const finished = await t.db.query<{ status: string; skew: number }>(
      `SELECT status, abs(extract(epoch FROM finished_at - (now() AT TIME ZONE 'utc')))::float8 AS skew
       FROM agent_runs WHERE id = $1::text`,
      [LIVE_RUN],
    );
    expect(finished.rows[0]!.status).toBe('completed');
    expect(finished.rows[0]!.skew).toBeLessThan(600);
    for (const name of [
      'sandbox_runtimes',
      'conversations',
      'schema_migrations',
      'runtime_cleanup_overrides',
    ])
      expect(await tableExists(name), name).toBe(false);
    const { rows } = await t.db.query<{ functions: number }>(
      "SELECT count(*)::int AS functions FROM pg_proc WHERE proname LIKE 'runtime\\_%'",
    );
    expect(rows[0]!.functions).toBe(0);
  });
});
