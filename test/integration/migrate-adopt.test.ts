/**
 * A platform database that already holds the contract's tables (created by the platform, not by
 * these migrations) is adopted: the migrations apply on top, and existing fenced rows get their
 * bookkeeping filled in.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { CONTRACT_COLUMNS } from '../../infra/contract-tables.ts';
import { loadMigrations, migrate } from '../../infra/migrate.ts';

const CONTRACT_SCHEMA = `
  CREATE TABLE conversations (
    id bigint generated always as identity primary key, uid text not null,
    thread_id text not null unique, workdir_path text not null);
  CREATE TABLE agent_runs (
    id text primary key, uid text not null, conversation_id bigint references conversations(id),
    conversation_thread_id text not null, runtime_scope_id text not null,
    run_type text not null default 'chat', created_by_run_id text, status text not null,
    runtime_cleanup_pending boolean not null default false, worker_id text, heartbeat_at timestamptz,
    lease_expires_at timestamptz, finished_at timestamptz,
    created_at timestamptz not null default now(), updated_at timestamptz not null default now());
  CREATE TABLE sandbox_runtimes (
    uid text not null, runtime_scope_id text not null, sandbox_id text not null,
    generation bigint not null, released_at timestamptz, primary key (uid, runtime_scope_id));`;

let admin: Database;
let db: Database;
let name: string;

beforeAll(async () => {
  const { adminUrl, driver, wsProxy } = inject('database');
  const options = { driver, wsProxy, lockTimeoutMs: 5_000, statementTimeoutMs: 30_000 };
  admin = await openDatabase({ url: adminUrl, maxConnections: 1, ...options });
  name = `rc_test_${process.ppid}_${randomBytes(5).toString('hex')}`;
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  db = await openDatabase({ url: url.toString(), ...options });
});
afterAll(async () => {
  await db?.end();
  await admin?.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin?.end();
});

describe('migrating a database that already has the contract schema', () => {
  it('applies every migration, keeps the rows and fills in the fence bookkeeping', async () => {
    await db.query(CONTRACT_SCHEMA);
    await db.query(
      `INSERT INTO conversations (uid, thread_id, workdir_path) VALUES ('u', 't', 'projects/p');
       INSERT INTO agent_runs (id, uid, conversation_thread_id, runtime_scope_id, status, runtime_cleanup_pending, finished_at)
       VALUES ('r1', 'u', 't', 's', 'completed', true, now() - interval '1 hour')`,
    );

    const applied = await migrate(db);

    expect(applied).toEqual((await loadMigrations()).map((m) => m.version));
    const { rows } = await db.query<{ pending: boolean; since_set: boolean; blocked: boolean }>(
      `SELECT runtime_cleanup_pending AS pending, runtime_cleanup_pending_since IS NOT NULL AS since_set,
              runtime_cleanup_blocked('u', 's') AS blocked
       FROM agent_runs WHERE id = 'r1'`,
    );
    expect(rows[0]).toEqual({ pending: true, since_set: true, blocked: true });
    expect(await migrate(db)).toEqual([]);
  });

  it('the columns checked before the first migration are the migrated schema’s, type for type', async () => {
    const { rows } = await db.query<{ table_name: string; column_name: string; data_type: string }>(
      `SELECT table_name, column_name, data_type FROM information_schema.columns
       WHERE table_schema = current_schema() AND table_name = ANY ($1::text[])`,
      [Object.keys(CONTRACT_COLUMNS)],
    );
    const migrated = new Map(rows.map((row) => [`${row.table_name}.${row.column_name}`, row.data_type]));
    for (const [table, columns] of Object.entries(CONTRACT_COLUMNS))
      for (const [column, type] of Object.entries(columns))
        expect(migrated.get(`${table}.${column}`), `${table}.${column}`).toBe(type);
  });
});
