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
import { REPO_ROOT, readDoc, section } from '../support/docs.ts';
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

describe('times written before the conversion, from a session not in UTC', () => {
  it('a naive UTC time is stored as written; an aware one, as the session’s local time', async () => {
    // As psycopg2 sends them: a naive datetime as `timestamp`, an aware one as `timestamptz`.
    await t.db.withTransaction(async (tx) => {
      await tx.query("SET LOCAL TimeZone = 'America/New_York'");
      await tx.query(
        `INSERT INTO agent_runs (id, user_id, thread_id, status, created_at, updated_at, finished_at) VALUES
           ('run-naive-utc', '${USER}', '${FINISHED_THREAD}', 'completed', '2026-11-30T13:00:00'::timestamp,
            '2026-11-30T13:00:00'::timestamp, '2026-11-30T13:00:00'::timestamp),
           ('run-aware', '${USER}', '${FINISHED_THREAD}', 'completed', '2026-11-30T13:00:00+00:00'::timestamptz,
            '2026-11-30T13:00:00+00:00'::timestamptz, '2026-11-30T13:00:00+00:00'::timestamptz)`,
      );
    });
    runsAfterCutOver.push('run-naive-utc', 'run-aware');
    // Hence the doc's order (read below, after adopt.sql): naive UTC until the conversion.
    expect(section(await readDoc('docs/adopting.md'), 2)).toContain(
      '**Before the conversion, keep writing naive UTC**',
    );
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

  it('adopt.sql reads the naive UTC write as the instant written; the aware write is off by the offset', async () => {
    const { rows } = await t.db.query(
      `SELECT id, (finished_at AT TIME ZONE 'UTC')::text AS finished_utc FROM agent_runs
       WHERE id IN ('run-naive-utc', 'run-aware') ORDER BY id`,
    );
    expect(rows).toEqual([
      // Why docs/adopting.md says to keep writing naive UTC until the conversion:
      { id: 'run-aware', finished_utc: '2026-11-30 08:00:00' },
      { id: 'run-naive-utc', finished_utc: '2026-11-30 13:00:00' },
    ]);
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
      // The runs' times back where they were, so the rollback below compares the rows as the
      // platform wrote them. Only those: moved forward, the reclaims' ended windows
      // (refuse_all_until) would lie in the future, and rollback.sql rightly refuses then.
      await t.db.query(
        `UPDATE agent_runs SET created_at = created_at + make_interval(secs => ${GRACE_SECONDS + 1}),
                updated_at = updated_at + make_interval(secs => ${GRACE_SECONDS + 1}),
                finished_at = finished_at + make_interval(secs => ${GRACE_SECONDS + 1})`,
      );
    }

    expect(live(idle) || live(keptAfterRelease)).toBe(false);
  });
});

/** rollback.sql run now: its refusal, or undefined when it ran (then rolled back here). */
async function rollbackRefusal(): Promise<string | undefined> {
  const script = await adoptionScript('rollback');
  try {
    await t.db.withTransaction(async (tx) => {
      // The script's own BEGIN/COMMIT become a warning and a no-op inside this transaction, which
      // is rolled back below: a refusal is the only way out that keeps the schema.
      await tx.query(script.replace(/^BEGIN;$/m, '').replace(/^COMMIT;$/m, ''));
      throw new Error('ran');
    });
  } catch (error) {
    const message = String(error);
    return message.includes('Error: ran') ? undefined : message;
  }
  return undefined;
}

/**
 * rollback.sql refuses while a fence is pending or any DELETE may still act (the three in-flight
 * windows), changing nothing; each cleared in turn, it runs.
 */
async function refusedWhileFencedOrInFlight(): Promise<void> {
  // The reclaims above left their tombstones refusing every record of those ids for a while yet.
  expect(await rollbackRefusal()).toContain('rollback refused: a DELETE of a sandbox may still act until');
  // Their time passing (as letTimePass moves it) without moving the platform's rows, compared below.
  await t.db.query(
    `UPDATE runtime_reclaim_tombstones SET reclaimed_at = reclaimed_at - interval '1 hour',
            expires_at = expires_at - interval '1 hour', refuse_all_until = refuse_all_until - interval '1 hour'`,
  );
  expect(await rollbackRefusal()).toBeUndefined();

  const fenced = `run-${randomUUID()}`;
  runsAfterCutOver.push(fenced);
  expect(await admitRun(t.db, { id: fenced, userId: USER, threadId: FINISHED_THREAD })).toBe(true);
  expect(await finishRun(t.db, fenced)).toBe(true);
  expect(await rollbackRefusal()).toContain('rollback refused: 1 fence(s) still pending');
  await t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [fenced]);

  await t.db.query(
    `UPDATE sandbox_runtimes SET delete_in_flight_until = clock_timestamp() + interval '1 minute'
     WHERE runtime_scope_id = $1::text`,
    [LIVE_THREAD],
  );
  expect(await rollbackRefusal()).toContain('rollback refused: a DELETE of a sandbox may still act until');
  await t.db.query('UPDATE sandbox_runtimes SET delete_in_flight_until = NULL');

  await t.db.query(
    `INSERT INTO runtime_reclaim_sightings (sandbox_id, reclaim_in_flight_until, reclaim_in_flight_token)
     VALUES ('sbx-in-flight', clock_timestamp() + interval '1 minute', 'reclaim-attempt')`,
  );
  expect(await rollbackRefusal()).toContain('a DELETE of a sandbox may still act until');
  await t.db.query("DELETE FROM runtime_reclaim_sightings WHERE sandbox_id = 'sbx-in-flight'");

  await t.db.query(
    `INSERT INTO runtime_reclaim_tombstones (sandbox_id, token, refuse_all_until, expires_at)
     VALUES ('sbx-in-flight', 'reclaim-attempt', clock_timestamp() + interval '1 minute',
             clock_timestamp() + interval '1 minute')`,
  );
  expect(await rollbackRefusal()).toContain('a DELETE of a sandbox may still act until');
  await t.db.query("DELETE FROM runtime_reclaim_tombstones WHERE sandbox_id = 'sbx-in-flight'");

  expect(await rollbackRefusal()).toBeUndefined();
}

describe('rollback.sql', () => {
  it("gives the platform back its tables and rows as they were, the cleanup's objects gone", async () => {
    await stack?.stop();
    stack = undefined;

    await refusedWhileFencedOrInFlight();
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

/** A new database holding the platform's schema and `rows`, adopted and migrated (section 6, steps 1 and 2). */
async function adoptedDatabase(rows: string): Promise<TestDatabase> {
  const db = await createTestDatabase({ empty: true });
  await db.db.query(await adoptionScript('platform-schema'));
  await db.db.query(rows);
  await db.db.query(await adoptionScript('adopt'));
  await migrate(db.db);
  return db;
}

describe('record-live-sandboxes.sql, with a thread whose sandbox a reclaim may still be deleting', () => {
  let r: TestDatabase;
  beforeAll(async () => {
    r = await adoptedDatabase(`
      INSERT INTO threads (id, user_id, project_id) VALUES
        ('thread-1', '${USER}', gen_random_uuid()), ('thread-2', '${USER}', gen_random_uuid()),
        ('thread-3', '${USER}', gen_random_uuid());
      INSERT INTO agent_runs (id, user_id, thread_id, status) VALUES
        ('run-1', '${USER}', 'thread-1', 'running'), ('run-2', '${USER}', 'thread-2', 'running'),
        ('run-3', '${USER}', 'thread-3', 'running');`);
  });
  afterAll(async () => {
    await r?.drop();
  });

  it('skips that thread alone, lists it, and records every other live thread', async () => {
    // What the reclaim guard lays before its DELETE: every record of the id refused (55006) until then.
    await r.db.query(
      `INSERT INTO runtime_reclaim_tombstones (sandbox_id, token, refuse_all_until, expires_at)
       VALUES ($1::text, 'reclaim-attempt', now() + interval '1 minute', now() + interval '1 minute')`,
      [sandboxIdOf('thread-2')],
    );

    const skipped = await r.db.withTransaction(async (tx) => {
      await tx.query(await adoptionScript('record-live-sandboxes'));
      return (
        await tx.query('SELECT uid, runtime_scope_id, sandbox_id, refusal FROM record_live_sandboxes_skipped')
      ).rows;
    });
    expect(skipped).toEqual([
      {
        uid: USER,
        runtime_scope_id: 'thread-2',
        sandbox_id: sandboxIdOf('thread-2'),
        refusal: expect.stringContaining(`sandbox ${sandboxIdOf('thread-2')} is being reclaimed`),
      },
    ]);
    const recorded = await r.db.query('SELECT runtime_scope_id FROM sandbox_runtimes ORDER BY 1');
    expect(recorded.rows).toEqual([{ runtime_scope_id: 'thread-1' }, { runtime_scope_id: 'thread-3' }]);

    // Run again once the refusal's time has passed: the skipped thread is recorded.
    await letTimePass(r.db, 61);
    await r.db.query(await adoptionScript('record-live-sandboxes'));
    const again = await r.db.query('SELECT runtime_scope_id FROM sandbox_runtimes ORDER BY 1');
    expect(again.rows.map((row) => row.runtime_scope_id)).toEqual(['thread-1', 'thread-2', 'thread-3']);
  });
});

describe('the cut-over in the documented order (section 6)', () => {
  let c: TestDatabase;
  let cut: TestStack | undefined;
  const alive = (threadId: string) => cut!.provisioner!.sandbox(sandboxIdOf(threadId)) !== undefined;
  /** The old API and the new one alike POST the thread's derived id; the provisioner reuses a live one. */
  async function post(threadId: string): Promise<void> {
    const response = await fetch(`${cut!.provisionerUrl}/api/sandboxes`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ sandbox_id: sandboxIdOf(threadId), thread_id: threadId, user_id: USER }),
    });
    expect(response.ok).toBe(true);
  }
  /** The old API: admits without asking, records nothing. */
  async function admitOld(runId: string, threadId: string): Promise<void> {
    await c.db.query(
      `INSERT INTO agent_runs (id, user_id, thread_id, status) VALUES ($1::text, $2::text, $3::text, 'running')`,
      [runId, USER, threadId],
    );
    await post(threadId);
  }

  beforeAll(async () => {
    // Before the cut-over: thread-a has a live run; thread-c and thread-z finished, their
    // sandboxes idle; thread-b and thread-n have none yet.
    c = await adoptedDatabase(`
      INSERT INTO threads (id, user_id, project_id) VALUES
        ('thread-a', '${USER}', gen_random_uuid()), ('thread-b', '${USER}', gen_random_uuid()),
        ('thread-c', '${USER}', gen_random_uuid()), ('thread-n', '${USER}', gen_random_uuid()),
        ('thread-z', '${USER}', gen_random_uuid());
      INSERT INTO agent_runs (id, user_id, thread_id, status, created_at, updated_at, finished_at) VALUES
        ('run-a', '${USER}', 'thread-a', 'running', now() AT TIME ZONE 'utc', now() AT TIME ZONE 'utc', NULL),
        ('run-c1', '${USER}', 'thread-c', 'completed', '2026-11-30 09:00', '2026-11-30 09:05', '2026-11-30 09:05'),
        ('run-z', '${USER}', 'thread-z', 'completed', '2026-11-30 09:00', '2026-11-30 09:05', '2026-11-30 09:05');`);
    cut = await startTestStack(c, {
      env: { RECLAIM_GRACE_SECONDS: String(GRACE_SECONDS) },
      stack: { provisionerMode: 'platform', reclaimer: false },
    });
    for (const thread of ['thread-a', 'thread-c', 'thread-z']) await post(thread);
  });
  afterAll(async () => {
    await cut?.stop();
    await c?.drop();
  });

  it('docs/adopting.md orders admission, then record-live-sandboxes.sql, then the cleanup, then the worker', async () => {
    const steps = [...section(await readDoc('docs/adopting.md'), 6).matchAll(/^\d+\. \*\*(.+?)\*\*/gm)].map(
      (match) => match[1]!,
    );
    const at = (words: string) => steps.findIndex((step) => step.includes(words));
    expect(at("platform's admission")).toBeGreaterThan(at('adopt.sql'));
    expect(at('record-live-sandboxes.sql')).toBeGreaterThan(at("platform's admission"));
    expect(at('Deploy the cleanup')).toBeGreaterThan(at('record-live-sandboxes.sql'));
    expect(at("worker's change")).toBeGreaterThan(at('Deploy the cleanup'));
    const rollback = [
      ...section(await readDoc('docs/adopting.md'), 7).matchAll(/^\d+\. \*\*(.+?)\*\*/gm),
    ].map((match) => match[1]!);
    const back = (words: string) => rollback.findIndex((step) => step.includes(words));
    expect(back("Remove the cleanup's deployment")).toBeGreaterThan(-1);
    expect(back('revert the admission')).toBeGreaterThan(back("Remove the cleanup's deployment"));
  });

  it('every running run keeps its sandbox through the grace; only the leaked one is reclaimed', async () => {
    // Step 3, rolling out: the new API admits (nothing is fenced, so it is not blocked) and records;
    // the old instances still admit and POST without recording, in a new thread and in a thread that
    // finished before the cut-over (the live container handed out again).
    expect(await admitRun(c.db, { id: 'run-n', userId: USER, threadId: 'thread-n' })).toBe(true);
    await post('thread-n');
    expect(
      await recordSandbox(c.db, { userId: USER, threadId: 'thread-n', sandboxId: sandboxIdOf('thread-n') }),
    ).toBe(1);
    await admitOld('run-b', 'thread-b');
    await admitOld('run-c2', 'thread-c');

    // Step 4, the rollout complete: the old instances' live threads are recorded.
    await c.db.query(await adoptionScript('record-live-sandboxes'));
    const recorded = await c.db.query(
      'SELECT runtime_scope_id, generation::int FROM sandbox_runtimes ORDER BY 1',
    );
    expect(recorded.rows).toEqual([
      { runtime_scope_id: 'thread-a', generation: 1 },
      { runtime_scope_id: 'thread-b', generation: 1 },
      { runtime_scope_id: 'thread-c', generation: 1 },
      { runtime_scope_id: 'thread-n', generation: 1 },
    ]);

    // Step 5: the cleanup, the reclaimer on its schedule, a grace and more.
    await cut!.runReclaimer();
    await letTimePass(c.db, GRACE_SECONDS + 1);
    expect(await cut!.runReclaimer()).toMatchObject({ reclaimed: 1 });

    expect(alive('thread-z')).toBe(false);
    for (const thread of ['thread-a', 'thread-b', 'thread-c', 'thread-n'])
      expect(alive(thread), thread).toBe(true);
  });

  it("step 6: a run finished by the worker's change is cleaned up, its sandbox deleted", async () => {
    expect(await finishRun(c.db, 'run-b')).toBe(true);
    await announceRunFinished(cut!.queues, 'run-b');
    await fencesCleared(c.db, ['run-b']);
    expect(alive('thread-b')).toBe(false);
    expect(alive('thread-a') && alive('thread-c') && alive('thread-n')).toBe(true);
  });
});
