/**
 * The migration runner on real PostgreSQL, each case on an empty database of its own: idempotent,
 * safe to run from two places at once, append-only, atomic; and the schema it builds is the
 * contract's (docs/integration.md §1), functions included.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { loadMigrations, type Migration, migrate } from '../../infra/migrate.ts';
import { insertConversation, insertRun } from '../support/factories.ts';
import { rejectionOf } from '../support/probes.ts';

const { adminUrl, driver, wsProxy } = inject('database');
const TIMEOUTS = { driver, lockTimeoutMs: 10_000, statementTimeoutMs: 30_000 };
let admin: Database;
const opened: Database[] = [];
const created: string[] = [];

beforeAll(async () => {
  admin = await openDatabase({ url: adminUrl, wsProxy, maxConnections: 1, ...TIMEOUTS });
});
afterAll(async () => {
  await Promise.all(opened.map((db) => db.end().catch(() => {})));
  for (const name of created) await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin?.end();
});

/** A new, empty database (no template), and a way to open more independent pools on it. */
async function emptyDatabase(): Promise<{ connect(): Promise<Database> }> {
  // The name is made here from hex digits only (CREATE DATABASE takes no parameters); the prefix
  // lets the global teardown sweep it up if this file crashes.
  const name = `rc_test_${process.ppid}_m${randomBytes(5).toString('hex')}`;
  await admin.query(`CREATE DATABASE ${name}`);
  created.push(name);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    async connect() {
      const db = await openDatabase({ url: url.toString(), wsProxy, maxConnections: 2, ...TIMEOUTS });
      opened.push(db);
      return db;
    },
  };
}

async function tableExists(db: Database, table: string): Promise<boolean> {
  const { rows } = await db.query<{ found: boolean }>('SELECT to_regclass($1::text) IS NOT NULL AS found', [
    table,
  ]);
  return rows[0]!.found;
}

describe('the migration runner', () => {
  it('applies every migration to an empty database, and a second run applies nothing', async () => {
    const db = await (await emptyDatabase()).connect();
    const versions = (await loadMigrations()).map((migration) => migration.version);

    expect(await migrate(db)).toEqual(versions);
    expect(await migrate(db)).toEqual([]);
    const { rows } = await db.query<{ version: number }>(
      'SELECT version FROM schema_migrations ORDER BY version',
    );
    expect(rows.map((row) => Number(row.version))).toEqual(versions);
  });

  it('serialises two runners started at once on two pools: one applies everything, the other nothing', async () => {
    const target = await emptyDatabase();
    const [first, second] = [await target.connect(), await target.connect()];
    const versions = (await loadMigrations()).map((migration) => migration.version);

    const results = await Promise.all([migrate(first), migrate(second)]);

    expect(results).toEqual(expect.arrayContaining([versions, []]));
    expect(await tableExists(first, 'agent_runs')).toBe(true);
    const { rows } = await first.query<{ applied: number }>(
      'SELECT count(*)::int AS applied FROM schema_migrations',
    );
    expect(rows[0]!.applied).toBe(versions.length);
  });

  it('refuses a migration edited after it was applied, and applies nothing else in that run', async () => {
    const db = await (await emptyDatabase()).connect();
    const migrations = await loadMigrations();
    await migrate(db, migrations);
    const edited: Migration[] = [
      { ...migrations[0]!, sql: `${migrations[0]!.sql}\n-- edited`, checksum: 'edited' },
      ...migrations.slice(1),
      { version: 9_999, name: 'later', sql: 'CREATE TABLE later_table (id int)', checksum: 'later' },
    ];

    const error = await rejectionOf(migrate(db, edited));

    expect(String(error)).toMatch(/was changed after it was applied/);
    expect(await tableExists(db, 'later_table')).toBe(false);
  });

  it('leaves nothing half-applied when a migration fails', async () => {
    const db = await (await emptyDatabase()).connect();
    const broken: Migration[] = [
      ...(await loadMigrations()),
      {
        version: 9_999,
        name: 'broken',
        sql: 'CREATE TABLE half_table (id int); SELECT 1/0',
        checksum: 'broken',
      },
    ];

    await rejectionOf(migrate(db, broken));

    expect(await tableExists(db, 'agent_runs')).toBe(false);
    expect(await tableExists(db, 'half_table')).toBe(false);
    expect(await migrate(db)).toEqual((await loadMigrations()).map((migration) => migration.version));
  });
});

describe('the schema matches the contract (docs/integration.md §1)', () => {
  let db: Database;
  beforeAll(async () => {
    db = await (await emptyDatabase()).connect();
    await migrate(db);
  });

  /** [column, type, nullable, default (as PostgreSQL prints it, or null)] */
  const CONTRACT_COLUMNS: Record<string, Array<[string, string, boolean, string | null]>> = {
    conversations: [
      ['id', 'bigint', false, null],
      ['uid', 'text', false, null],
      ['thread_id', 'text', false, null],
      ['workdir_path', 'text', false, null],
    ],
    agent_runs: [
      ['id', 'text', false, null],
      ['uid', 'text', false, null],
      ['conversation_id', 'bigint', true, null],
      ['conversation_thread_id', 'text', false, null],
      ['runtime_scope_id', 'text', false, null],
      ['run_type', 'text', false, "'chat'::text"],
      ['created_by_run_id', 'text', true, null],
      ['status', 'text', false, null],
      ['runtime_cleanup_pending', 'boolean', false, 'false'],
      ['worker_id', 'text', true, null],
      ['heartbeat_at', 'timestamp with time zone', true, null],
      ['lease_expires_at', 'timestamp with time zone', true, null],
      ['finished_at', 'timestamp with time zone', true, null],
      ['created_at', 'timestamp with time zone', false, 'now()'],
      ['updated_at', 'timestamp with time zone', false, 'now()'],
    ],
    sandbox_runtimes: [
      ['uid', 'text', false, null],
      ['runtime_scope_id', 'text', false, null],
      ['sandbox_id', 'text', false, null],
      ['generation', 'bigint', false, null],
      ['released_at', 'timestamp with time zone', true, null],
    ],
  };

  it.each(Object.keys(CONTRACT_COLUMNS))(
    'gives %s the contract columns, and only nullable or defaulted extras',
    async (table) => {
      const { rows } = await db.query<{
        name: string;
        type: string;
        nullable: boolean;
        default: string | null;
        identity: string | null;
      }>(
        `SELECT column_name AS name, data_type AS type, is_nullable = 'YES' AS nullable, column_default AS default,
              identity_generation AS identity
       FROM information_schema.columns WHERE table_schema = 'public' AND table_name = $1::text`,
        [table],
      );
      const byName = new Map(rows.map((row) => [row.name, row]));
      for (const [name, type, nullable, defaultValue] of CONTRACT_COLUMNS[table]!) {
        expect(byName.get(name), `${table}.${name}`).toMatchObject({ type, nullable, default: defaultValue });
      }
      const contractNames = new Set(CONTRACT_COLUMNS[table]!.map(([name]) => name));
      for (const extra of rows.filter((row) => !contractNames.has(row.name))) {
        expect(
          extra.nullable || extra.default !== null,
          `${table}.${extra.name} must be nullable or defaulted`,
        ).toBe(true);
      }
      if (table === 'conversations') expect(byName.get('id')?.identity).toBe('ALWAYS');
    },
  );

  it('has the contract keys: primary keys, unique thread_id, and the conversation foreign key', async () => {
    const { rows } = await db.query<{ name: string; type: string; definition: string }>(
      `SELECT conrelid::regclass::text AS name, contype::text AS type, pg_get_constraintdef(oid) AS definition
       FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND contype IN ('p', 'u', 'f')`,
    );
    expect(rows).toEqual(
      expect.arrayContaining([
        { name: 'conversations', type: 'p', definition: 'PRIMARY KEY (id)' },
        { name: 'conversations', type: 'u', definition: 'UNIQUE (thread_id)' },
        { name: 'agent_runs', type: 'p', definition: 'PRIMARY KEY (id)' },
        {
          name: 'agent_runs',
          type: 'f',
          definition: 'FOREIGN KEY (conversation_id) REFERENCES conversations(id)',
        },
        { name: 'sandbox_runtimes', type: 'p', definition: 'PRIMARY KEY (uid, runtime_scope_id)' },
      ]),
    );
  });

  it('declares runtime_cleanup_lock_key(text, text) immutable, returning bigint', async () => {
    const { rows } = await db.query<{ volatility: string; returns: string; args: string }>(
      `SELECT provolatile::text AS volatility, prorettype::regtype::text AS returns,
              pg_get_function_identity_arguments(oid) AS args
       FROM pg_proc WHERE proname = 'runtime_cleanup_lock_key'`,
    );
    expect(rows).toEqual([{ volatility: 'i', returns: 'bigint', args: 'uid text, runtime_scope_id text' }]);
  });

  it('computes the same lock key in every session, and different keys for different scopes', async () => {
    const key = async (executor: Database, uid: string, scope: string) =>
      (
        await executor.query<{ key: string }>(
          'SELECT runtime_cleanup_lock_key($1::text, $2::text)::text AS key',
          [uid, scope],
        )
      ).rows[0]!.key;
    const elsewhere = await (await emptyDatabase()).connect();
    await migrate(elsewhere);

    const here = await key(db, 'user-1', 'scope-1');
    expect(await key(db, 'user-1', 'scope-1')).toBe(here);
    expect(await key(elsewhere, 'user-1', 'scope-1')).toBe(here);
    expect(BigInt(here)).not.toBe(0n);
    expect(await key(db, 'user-1', 'scope-2')).not.toBe(here);
    // A separator inside an id cannot make two scopes share a key.
    expect(await key(db, 'a:b', 'c')).not.toBe(await key(db, 'a', 'b:c'));
  });

  it('declares runtime_cleanup_blocked(text, text) returning boolean', async () => {
    const { rows } = await db.query<{ returns: string; args: string }>(
      `SELECT prorettype::regtype::text AS returns, pg_get_function_identity_arguments(oid) AS args
       FROM pg_proc WHERE proname = 'runtime_cleanup_blocked'`,
    );
    expect(rows).toEqual([{ returns: 'boolean', args: 'uid text, runtime_scope_id text' }]);
  });

  it('reports a scope blocked only while a root run (chat or resume) of that scope has its fence up', async () => {
    const blocked = async (uid: string, scope: string) =>
      (
        await db.query<{ blocked: boolean }>(
          'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
          [uid, scope],
        )
      ).rows[0]!.blocked;
    const conversation = await insertConversation(db, { uid: 'u-b' });
    const run = (scope: string, runType: string, fence: boolean) =>
      insertRun(db, {
        uid: 'u-b',
        conversationId: conversation.id,
        threadId: conversation.threadId,
        runtimeScopeId: scope,
        runType,
        status: 'completed',
        fence,
      });

    await run('s-subagent', 'subagent', true);
    await run('s-clear', 'chat', false);
    const chat = await run('s-chat', 'chat', true);
    await run('s-resume', 'resume', true);

    expect(await blocked('u-b', 's-subagent')).toBe(false);
    expect(await blocked('u-b', 's-clear')).toBe(false);
    expect(await blocked('u-b', 's-chat')).toBe(true);
    expect(await blocked('u-b', 's-resume')).toBe(true);
    expect(await blocked('someone-else', 's-chat')).toBe(false);
    expect(await blocked('u-b', 's-nothing')).toBe(false);
    await db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [chat]);
    expect(await blocked('u-b', 's-chat')).toBe(false);
  });

  it('accepts rows written with only the contract columns that have no default', async () => {
    await db.query(
      `INSERT INTO conversations (uid, thread_id, workdir_path) VALUES ('u-min', 't-min', 'projects/min')`,
    );
    await db.query(
      `INSERT INTO agent_runs (id, uid, conversation_thread_id, runtime_scope_id, status)
       VALUES ('run-min', 'u-min', 't-min', 's-min', 'running')`,
    );
    await db.query(
      `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation) VALUES ('u-min', 's-min', 'sbx', 1)`,
    );
    const { rows } = await db.query<{ run_type: string; pending: boolean; stamped: boolean }>(
      `SELECT run_type, runtime_cleanup_pending AS pending, created_at IS NOT NULL AND updated_at IS NOT NULL AS stamped
       FROM agent_runs WHERE id = 'run-min'`,
    );
    expect(rows[0]).toEqual({ run_type: 'chat', pending: false, stamped: true });
  });

  it('stamps runtime_cleanup_pending_since when the fence goes up, keeps it while up, and clears it when down', async () => {
    const since = async () =>
      (
        await db.query<{ since: string | null }>(
          `SELECT runtime_cleanup_pending_since::text AS since FROM agent_runs WHERE id = 'run-fence'`,
        )
      ).rows[0]!.since;
    const setFence = (pending: boolean) =>
      db.query(`UPDATE agent_runs SET runtime_cleanup_pending = $1::boolean WHERE id = 'run-fence'`, [
        pending,
      ]);
    await db.query(
      `INSERT INTO conversations (uid, thread_id, workdir_path) VALUES ('u-f', 't-f', 'projects/f')`,
    );
    await db.query(
      `INSERT INTO agent_runs (id, uid, conversation_thread_id, runtime_scope_id, status, runtime_cleanup_pending)
       VALUES ('run-fence', 'u-f', 't-f', 's-f', 'completed', true)`,
    );

    const first = await since();
    expect(first).not.toBeNull();
    await setFence(true);
    await db.query(`UPDATE agent_runs SET status = 'failed' WHERE id = 'run-fence'`);
    expect(await since()).toBe(first);
    await setFence(false);
    expect(await since()).toBeNull();
    await setFence(true);
    const raisedAgain = await since();
    expect(raisedAgain).not.toBeNull();
    expect(raisedAgain).not.toBe(first);
  });
});
