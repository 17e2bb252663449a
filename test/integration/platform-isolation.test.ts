/**
 * The platform's own steps on a database whose default isolation is REPEATABLE READ (contract
 * v1.2: the platform's admission and sandbox record run at READ COMMITTED). Under a higher level
 * the platform's statement after its lock reads a snapshot older than the lock, so it would miss a
 * guard's delete-in-flight record and admit a run (or record a sandbox) under a DELETE about to go
 * out. The shared functions refuse to answer from such a snapshot (SQLSTATE 25000): the platform
 * fails loudly at its first admission instead of racing silently. Real sessions of the platform's
 * own (node-postgres over TCP) at the database's default, against real PostgreSQL.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterEach, expect, inject, it } from 'vitest';
import type { Queues } from '../../functions/adapters/queues.ts';
import { beginReclaim, ReclaimVerdict } from '../../functions/cleanup/reclaim-guard.ts';
import { PlatformSimulator } from '../../infra/local/platform.ts';
import { insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { letTimePass } from '../support/reclaim-time.ts';
import { eventually } from '../support/stack.ts';

const database = useDatabaseFixture();
const GRACE_SECONDS = 60;
const GUARD = { graceSeconds: GRACE_SECONDS, inFlightSeconds: 60, lockTimeoutMs: 20_000 };
const sessions: pg.Client[] = [];

afterEach(async () => {
  for (const session of sessions.splice(0)) await session.end().catch(() => {});
  await database.t.setDefaultIsolation(null);
});

/**
 * A session of the platform's own, at the database's default isolation (not the adapter's), on
 * the server itself: a transaction-mode pooler would hand out server connections made before the
 * ALTER DATABASE.
 */
async function platformSession(): Promise<pg.Client> {
  const url = new URL(inject('database').adminUrl);
  url.pathname = `/${database.t.name}`;
  const session = new pg.Client({ connectionString: url.toString() });
  await session.connect();
  sessions.push(session);
  return session;
}

async function waitingAdvisoryLocks(): Promise<number> {
  const { rows } = await database.t.db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
  );
  return rows[0]!.n;
}

/** Holds an advisory lock in a transaction of its own until released (to order an interleaving). */
async function holdLock(sql: string, values: unknown[]): Promise<{ release(): Promise<void> }> {
  let release!: () => void;
  let locked!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const taken = new Promise<void>((resolve) => (locked = resolve));
  const holder = database.t.db.withTransaction(async (tx) => {
    await tx.query(sql, values);
    locked();
    await released;
  });
  await taken;
  return {
    release: async () => {
      release();
      await holder;
    },
  };
}

async function scope() {
  const uid = `user-${randomUUID().slice(0, 8)}`;
  const conversation = await insertConversation(database.t.db, { uid });
  return {
    uid,
    runtimeScopeId: `scope-${randomUUID().slice(0, 8)}`,
    threadId: conversation.threadId,
    conversationId: conversation.id,
  };
}

const repeatableRead = () => database.t.setDefaultIsolation('repeatable read');

it('admitting as step 2 says while a guard holds the scope lock: refused with 25000, never a run under the record', async () => {
  const s = await scope();
  const sandboxId = `sbx-${s.runtimeScopeId}`;
  await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 });
  await insertRun(database.t.db, { ...s, status: 'completed' });
  await database.t.db.query(
    'INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation) VALUES ($1, 1)',
    [sandboxId],
  );
  await letTimePass(database.t.db, GRACE_SECONDS + 1);
  await repeatableRead();
  // The guard takes the scope's lock, then waits for the id's (held here only to order the race).
  const idLock = await holdLock('SELECT pg_advisory_xact_lock(runtime_reclaim_lock_key($1::text))', [
    sandboxId,
  ]);
  const guard = beginReclaim(
    database.t.db,
    { sandboxId, generation: 1, generationListed: true },
    { ...GUARD, token: 'reclaim:platform-isolation-1' },
  );
  await eventually('the guard to wait for the id lock', async () => (await waitingAdvisoryLocks()) >= 1);
  const platform = await platformSession();
  await platform.query('BEGIN');
  expect(
    (await platform.query("SELECT current_setting('transaction_isolation') AS level")).rows[0].level,
  ).toBe('repeatable read');
  const lock = platform.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
    s.uid,
    s.runtimeScopeId,
  ]);
  await eventually(
    'the admission to wait for the scope lock',
    async () => (await waitingAdvisoryLocks()) >= 2,
  );
  await idLock.release();
  expect((await guard).verdict).toBe(ReclaimVerdict.PROCEED);
  await lock;
  const admission = await platform
    .query(
      `INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, status)
       SELECT $1::text, $2::text, $3::bigint, $4::text, $5::text, 'running'
       WHERE NOT runtime_cleanup_blocked($2::text, $5::text)`,
      [`run-${randomUUID()}`, s.uid, s.conversationId, s.threadId, s.runtimeScopeId],
    )
    .then(
      (result) => `admitted ${result.rowCount}`,
      (error: { code?: string; message?: string }) => `${error.code}: ${error.message}`,
    );
  await platform.query('ROLLBACK');
  expect(admission).toMatch(/^25000: .*READ COMMITTED/);
  const { rows } = await database.t.db.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM agent_runs WHERE uid = $1 AND status = 'running'",
    [s.uid],
  );
  expect(rows[0]!.n).toBe(0);
});

it('the same admission at READ COMMITTED, as the contract asks: refused by runtime_cleanup_blocked (0 rows)', async () => {
  const s = await scope();
  const sandboxId = `sbx-${s.runtimeScopeId}`;
  await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 });
  await insertRun(database.t.db, { ...s, status: 'completed' });
  await database.t.db.query(
    'INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation) VALUES ($1, 1)',
    [sandboxId],
  );
  await letTimePass(database.t.db, GRACE_SECONDS + 1);
  await repeatableRead();
  const guard = await beginReclaim(
    database.t.db,
    { sandboxId, generation: 1, generationListed: true },
    { ...GUARD, token: 'reclaim:platform-isolation-2' },
  );
  expect(guard.verdict).toBe(ReclaimVerdict.PROCEED);
  const platform = await platformSession();
  await platform.query('BEGIN ISOLATION LEVEL READ COMMITTED');
  await platform.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
    s.uid,
    s.runtimeScopeId,
  ]);
  const admitted = await platform.query(
    `INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, status)
     SELECT $1::text, $2::text, $3::bigint, $4::text, $5::text, 'running'
     WHERE NOT runtime_cleanup_blocked($2::text, $5::text)`,
    [`run-${randomUUID()}`, s.uid, s.conversationId, s.threadId, s.runtimeScopeId],
  );
  await platform.query('COMMIT');
  expect(admitted.rowCount).toBe(0);
});

it('recording an id a reclaim guard is laying its records on, at REPEATABLE READ: refused, never accepted', async () => {
  const sandboxId = `sbx-unrecorded-${randomUUID().slice(0, 8)}`;
  await database.t.db.query('INSERT INTO runtime_reclaim_sightings (sandbox_id) VALUES ($1::text)', [
    sandboxId,
  ]);
  await letTimePass(database.t.db, GRACE_SECONDS + 1);
  await repeatableRead();
  const idLock = await holdLock('SELECT pg_advisory_xact_lock(runtime_reclaim_lock_key($1::text))', [
    sandboxId,
  ]);
  const guard = beginReclaim(
    database.t.db,
    { sandboxId, generation: 0, generationListed: false },
    { ...GUARD, token: 'reclaim:platform-isolation-3' },
  );
  await eventually('the guard to wait for the id lock', async () => (await waitingAdvisoryLocks()) >= 1);
  // The platform records what its POST answered (step 3): one autocommit statement.
  const s = await scope();
  const platform = await platformSession();
  const record = platform
    .query(
      `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
       VALUES ($1::text, $2::text, $3::text, 1)`,
      [s.uid, s.runtimeScopeId, sandboxId],
    )
    .then(
      () => 'accepted',
      (error: { code?: string }) => error.code ?? String(error),
    );
  await idLock.release();
  expect((await guard).verdict).toBe(ReclaimVerdict.PROCEED);
  // Refused: at REPEATABLE READ for the level (25000), at READ COMMITTED by the guard's record (55006).
  expect(['25000', '55006']).toContain(await record);
});

it('recording an id no reclaim knows of works at any level (bulk loads are left alone)', async () => {
  await repeatableRead();
  const s = await scope();
  const platform = await platformSession();
  await platform.query(
    'INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation) VALUES ($1, $2, $3, 1)',
    [s.uid, s.runtimeScopeId, `sbx-${randomUUID().slice(0, 8)}`],
  );
});

it("the local platform (the demo's, the stack's, the chaos suite's) records a sandbox the reclaimer has listed, on a REPEATABLE READ database", async () => {
  // Its record was a plain statement at the database's default: the trigger refused it with 25000
  // once the reclaimer had listed the id, and the chaos suite's repeatable_read_default episode left
  // admitted runs running with no sandbox recorded (fences never cleared, run-finished never done).
  const s = await scope();
  const sandboxId = `sbx-${s.runtimeScopeId}`;
  await database.t.db.query('INSERT INTO runtime_reclaim_sightings (sandbox_id) VALUES ($1::text)', [
    sandboxId,
  ]);
  await repeatableRead();
  const platform = new PlatformSimulator(database.t.db, {} as Queues, 'http://127.0.0.1:9/unused');
  await platform.recordSandbox({ ...s, workdirPath: `/workdir/${s.uid}` }, { sandboxId, generation: 1 });
  const { rows } = await database.t.db.query<{ generation: string }>(
    'SELECT generation FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
    [s.uid, s.runtimeScopeId],
  );
  expect(rows.map((row) => Number(row.generation))).toEqual([1]);
});
