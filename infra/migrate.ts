/**
 * A minimal migration runner: numbered `.sql` files in `infra/migrations/`, applied in order,
 * each recorded with its checksum in `schema_migrations`. Everything runs in one transaction
 * under an advisory lock, so concurrent runners (two test workers, a deploy and an operator)
 * serialise and a failed migration leaves nothing half-applied. An applied file that was edited
 * afterwards is refused: migrations are append-only.
 */
import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type { Database } from '../functions/adapters/database.ts';

export const MIGRATIONS_DIR = fileURLToPath(new URL('./migrations/', import.meta.url));

/** Any constant works; this one is "rcmigrat" in ASCII (0x72636d6967726174), for `pg_locks` readers. */
const MIGRATION_LOCK_KEY = '8242552042492682612';

export interface Migration {
  version: number;
  name: string;
  sql: string;
  checksum: string;
}

export async function loadMigrations(dir = MIGRATIONS_DIR): Promise<Migration[]> {
  const files = (await readdir(dir)).filter((file) => file.endsWith('.sql')).sort();
  const migrations: Migration[] = [];
  for (const file of files) {
    const match = /^(\d+)_([\w-]+)\.sql$/.exec(file);
    if (!match) throw new Error(`migration file ${file} must be named NNN_name.sql`);
    const sql = await readFile(new URL(file, `file://${dir}/`), 'utf8');
    const version = Number(match[1]);
    if (migrations.some((m) => m.version === version))
      throw new Error(`duplicate migration version ${version}`);
    migrations.push({
      version,
      name: match[2]!,
      sql,
      checksum: createHash('sha256').update(sql).digest('hex'),
    });
  }
  return migrations;
}

const CREATE_LEDGER = `
  CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
  )`;
const SELECT_APPLIED = 'SELECT version, checksum FROM schema_migrations ORDER BY version';
const RECORD_APPLIED =
  'INSERT INTO schema_migrations (version, name, checksum) VALUES ($1::integer, $2::text, $3::text)';

/** Applies the pending migrations; returns the versions it applied (empty when up to date). */
export async function migrate(db: Database, migrations?: Migration[]): Promise<number[]> {
  const all = migrations ?? (await loadMigrations());
  return db.withTransaction(async (tx) => {
    await tx.query(`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK_KEY}::bigint)`);
    await tx.query(CREATE_LEDGER);
    const applied = new Map(
      (await tx.query<{ version: number; checksum: string }>(SELECT_APPLIED)).rows.map((row) => [
        Number(row.version),
        row.checksum,
      ]),
    );
    const done: number[] = [];
    for (const migration of all) {
      const checksum = applied.get(migration.version);
      if (checksum !== undefined) {
        if (checksum !== migration.checksum) {
          throw new Error(
            `migration ${migration.version}_${migration.name} was changed after it was applied; add a new migration instead`,
          );
        }
        continue;
      }
      await tx.query(migration.sql);
      await tx.query(RECORD_APPLIED, [migration.version, migration.name, migration.checksum]);
      done.push(migration.version);
    }
    return done;
  });
}
