/**
 * Migrations 001–010 were rewritten when the SQL functions moved to infra/sql/ (issue 23). A
 * database that applied the OLD texts, wholly or in part, must still migrate, and end in exactly
 * the schema a fresh database gets: same tables, columns, constraints, indexes, functions and
 * triggers (infra/schema-dump.ts, compared as text).
 *
 * The old texts are read from git history (commit 38a81ac, the last before the rewrite) and
 * applied as the old runner applied them: in order, each recorded with its checksum in
 * schema_migrations. Then today's runner migrates the database.
 */
import { execFile } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { applySchema, loadMigrations, type Migration } from '../../infra/migrate.ts';
import { dumpSchema } from '../../infra/schema-dump.ts';
import { SUPERSEDED_AT_COMMIT, SUPERSEDED_MIGRATION_CHECKSUMS } from '../../infra/superseded-migrations.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

const run = promisify(execFile);
const ROOT = new URL('../../', import.meta.url);

async function git(args: string[]): Promise<string> {
  try {
    return (await run('git', args, { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 })).stdout;
  } catch (error) {
    throw new Error(
      `this test reads the old migration texts from git history (git ${args.join(' ')}) and could not: ` +
        `run it in a clone that has commit ${SUPERSEDED_AT_COMMIT} (not a shallow clone or an export; ` +
        `git fetch --unshallow). ${error instanceof Error ? error.message : String(error)}`,
    );
  }
}

/** The migrations as they were at the commit before the rewrite. */
async function oldMigrations(): Promise<Migration[]> {
  const names = (await git(['ls-tree', '--name-only', `${SUPERSEDED_AT_COMMIT}:infra/migrations/`]))
    .split('\n')
    .filter((name) => name.endsWith('.sql'))
    .sort();
  return Promise.all(
    names.map(async (file) => {
      const [, version, name] = /^(\d+)_([\w-]+)\.sql$/.exec(file)!;
      const sql = await git(['show', `${SUPERSEDED_AT_COMMIT}:infra/migrations/${file}`]);
      return {
        version: Number(version),
        name: name!,
        sql,
        checksum: createHash('sha256').update(sql).digest('hex'),
      };
    }),
  );
}

/** What the old runner did: the ledger, then each file in order, recorded with its checksum. */
async function applyAsTheOldRunner(t: TestDatabase, migrations: Migration[]): Promise<void> {
  await t.db.withTransaction(async (tx) => {
    await tx.query(`CREATE TABLE schema_migrations (
      version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT now())`);
    for (const migration of migrations) {
      await tx.query(migration.sql);
      await tx.query(
        'INSERT INTO schema_migrations (version, name, checksum) VALUES ($1::integer, $2::text, $3::text)',
        [migration.version, migration.name, migration.checksum],
      );
    }
  });
}

/** A fenced run with a live sandbox, written with the contract's columns only (no new function). */
async function fencedRunWrittenBefore(t: TestDatabase): Promise<string> {
  const id = `run-${randomUUID()}`;
  await t.db.query(
    `WITH c AS (INSERT INTO conversations (uid, thread_id, workdir_path) VALUES ('u', $1::text, 'projects/p') RETURNING id)
     INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, status, runtime_cleanup_pending)
     SELECT $1::text, 'u', c.id, $1::text, 's', 'completed', true FROM c`,
    [id],
  );
  await t.db.query(
    `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation) VALUES ('u', 's', 'sbx', 1)`,
  );
  return id;
}

let old: Migration[];
let fresh: TestDatabase;
let freshSchema: string;
const opened: TestDatabase[] = [];

beforeAll(async () => {
  old = await oldMigrations();
  fresh = await createTestDatabase({ empty: true });
  opened.push(fresh);
  await applySchema(fresh.db);
  freshSchema = await dumpSchema(fresh.db);
});
afterAll(async () => {
  for (const t of opened) await t.drop().catch(() => {});
});

describe('databases migrated with the old migration texts', () => {
  it('the superseded checksums are exactly the old texts that differ from today’s files', async () => {
    const current = new Map(
      (await loadMigrations()).map((migration) => [migration.version, migration.checksum]),
    );
    expect(old.map((migration) => migration.version)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    const rewritten = old.filter((migration) => current.get(migration.version) !== migration.checksum);
    expect(
      Object.fromEntries(rewritten.map((migration) => [migration.version, [migration.checksum]])),
    ).toEqual(SUPERSEDED_MIGRATION_CHECKSUMS);
  });

  it.each([10, 8, 4, 1])(
    'old 001–%i applied: migrates, and ends with exactly the fresh schema, its data kept',
    async (last) => {
      const t = await createTestDatabase({ empty: true });
      opened.push(t);
      await applyAsTheOldRunner(
        t,
        old.filter((migration) => migration.version <= last),
      );
      const s = last >= 5 ? await fencedRunWrittenBefore(t) : undefined;

      const changes = await applySchema(t.db);

      const all = (await loadMigrations()).map((migration) => migration.version);
      expect(changes.migrations).toEqual(all.filter((version) => version > last));
      expect(await dumpSchema(t.db)).toBe(freshSchema);
      if (s) expect((await fenceCheck(t.db, s)).outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
      // Up to date now: a second run applies nothing.
      expect(await applySchema(t.db)).toEqual({ migrations: [], functions: [] });
    },
  );

  it('a fresh database has the committed schema too (a second run applies nothing)', async () => {
    expect(await applySchema(fresh.db)).toEqual({ migrations: [], functions: [] });
    expect(await dumpSchema(fresh.db)).toBe(freshSchema);
  });

  it('still refuses an applied migration whose checksum is neither today’s nor a superseded one', async () => {
    const t = await createTestDatabase({ empty: true });
    opened.push(t);
    await applyAsTheOldRunner(t, [{ ...old[0]!, checksum: 'some-other-text' }]);
    await expect(applySchema(t.db)).rejects.toThrow(/migration 1_schema was changed after it was applied/);
  });
});
