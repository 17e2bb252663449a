/**
 * The schema runner: `infra/sql/` (one file per SQL function, its current body) and the numbered
 * migrations in `infra/migrations/` (tables, columns, indexes, triggers and data changes), applied
 * in ONE transaction under an advisory lock, so concurrent runners (two test workers, a deploy and
 * an operator) serialise and a failure leaves nothing half-applied.
 *
 * Order: the function files first, then the pending migrations. A migration may depend on a
 * function (a partial index written with runtime_cleanup_status_is_active, a CREATE TRIGGER naming
 * its trigger function), never the other way round at creation time: the files are applied with
 * `check_function_bodies = off` (as pg_dump's restores do), so a body may name tables a pending
 * migration has yet to create. A function's signature (arguments, result) may therefore name only
 * built-in types. See infra/sql/README.md.
 *
 * Migrations are append-only: an applied file that was edited afterwards is refused, unless its
 * recorded checksum is one of that version's superseded texts (infra/superseded-migrations.ts).
 * Function files are re-applied whenever their checksum differs from the one recorded in
 * `schema_functions`; CREATE OR REPLACE keeps the function's grants and its dependents (indexes,
 * triggers). A file that changes its function's result type or argument names is refused by CREATE
 * OR REPLACE; the runner then drops the old function and creates the new one, which fails (nothing
 * applied, the dependents named) if an index or trigger still depends on it. A file that changes
 * the argument types creates a second function of that name; the runner drops the old one.
 */
import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type { Database, Executor } from '../functions/adapters/database.ts';
import { refuseTablesOfAnotherShape } from './contract-tables.ts';
import { SUPERSEDED_MIGRATION_CHECKSUMS } from './superseded-migrations.ts';

export const MIGRATIONS_DIR = fileURLToPath(new URL('./migrations/', import.meta.url));
export const FUNCTIONS_DIR = fileURLToPath(new URL('./sql/', import.meta.url));

/** Any constant works; this one is "rcmigrat" in ASCII (0x72636d6967726174), for `pg_locks` readers. */
const MIGRATION_LOCK_KEY = '8242552042492682612';

export interface Migration {
  version: number;
  name: string;
  sql: string;
  checksum: string;
}

/** One file of infra/sql/: the whole current definition of the function it is named after. */
export interface FunctionFile {
  /** The function's name, and the file's without `.sql`. */
  name: string;
  sql: string;
  checksum: string;
}

function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
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
    migrations.push({ version, name: match[2]!, sql, checksum: sha256(sql) });
  }
  return migrations;
}

/** Every `CREATE [OR REPLACE] FUNCTION name` in a SQL text, outside `--` comments. */
export function functionsCreatedIn(sql: string): string[] {
  const code = sql.replace(/--[^\n]*/g, '');
  return [...code.matchAll(/\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?:public\.)?"?(\w+)"?\s*\(/gi)].map(
    (match) => match[1]!.toLowerCase(),
  );
}

/**
 * Reads infra/sql/: each `name.sql` must create exactly one function, `name` (so `git grep` finds a
 * function's body in exactly one file, and the file in the obvious place).
 */
export async function loadFunctionFiles(dir = FUNCTIONS_DIR): Promise<FunctionFile[]> {
  const files = (await readdir(dir)).filter((file) => file.endsWith('.sql')).sort();
  const loaded: FunctionFile[] = [];
  for (const file of files) {
    const match = /^([a-z_][a-z0-9_]*)\.sql$/.exec(file);
    if (!match) throw new Error(`function file ${file} must be named <function_name>.sql (lower case)`);
    const sql = await readFile(new URL(file, `file://${dir}/`), 'utf8');
    const created = functionsCreatedIn(sql);
    if (created.length !== 1 || created[0] !== match[1]) {
      throw new Error(
        `function file ${file} must create exactly one function, ${match[1]}; it creates ${created.length ? created.join(', ') : 'none'}`,
      );
    }
    loaded.push({ name: match[1]!, sql, checksum: sha256(sql) });
  }
  return loaded;
}

const CREATE_LEDGER = `
  CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
  )`;
const CREATE_FUNCTION_LEDGER = `
  CREATE TABLE IF NOT EXISTS schema_functions (
    name        text PRIMARY KEY,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
  )`;
const SELECT_APPLIED = 'SELECT version, checksum FROM schema_migrations ORDER BY version';
const RECORD_APPLIED =
  'INSERT INTO schema_migrations (version, name, checksum) VALUES ($1::integer, $2::text, $3::text)';
const SELECT_APPLIED_FUNCTIONS = 'SELECT name, checksum FROM schema_functions';
const RECORD_FUNCTION = `
  INSERT INTO schema_functions (name, checksum) VALUES ($1::text, $2::text)
  ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()`;
/** The functions of that name in the schema the files are applied to (unqualified names land there). */
const OVERLOADS = `
  SELECT p.oid::regprocedure::text AS signature FROM pg_proc p
  WHERE p.proname = $1::text AND p.pronamespace = current_schema()::regnamespace
  ORDER BY p.oid`;
/** What depends on a function (an index predicate, a trigger), for the refusal's message. */
const DEPENDENTS = `
  SELECT pg_describe_object(d.classid, d.objid, d.objsubid) AS dependent FROM pg_depend d
  WHERE d.refclassid = 'pg_proc'::regclass AND d.refobjid = $1::text::regprocedure AND d.deptype = 'n'
  ORDER BY 1`;
/** SQLSTATE of "cannot change return type of existing function" and "cannot change name of input parameter". */
const INVALID_FUNCTION_DEFINITION = '42P13';

export interface SchemaChanges {
  /** The migration versions applied (empty when none was pending). */
  migrations: number[];
  /** The function files (re)applied: new, or changed since they were last applied. */
  functions: string[];
}

export interface MigrateOptions {
  /** Default: infra/sql/. */
  functions?: FunctionFile[];
  /** Default: infra/superseded-migrations.ts. */
  superseded?: Readonly<Record<number, readonly string[]>>;
}

/** Applies the pending migrations; returns the versions it applied (empty when up to date). */
export async function migrate(
  db: Database,
  migrations?: Migration[],
  options: MigrateOptions = {},
): Promise<number[]> {
  return (await applySchema(db, migrations, options)).migrations;
}

/** `migrate`, reporting the function files it applied too. */
export async function applySchema(
  db: Database,
  migrations?: Migration[],
  options: MigrateOptions = {},
): Promise<SchemaChanges> {
  const all = migrations ?? (await loadMigrations());
  const functions = options.functions ?? (await loadFunctionFiles());
  const superseded = options.superseded ?? SUPERSEDED_MIGRATION_CHECKSUMS;
  return db.withTransaction(async (tx) => {
    await tx.query(`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK_KEY}::bigint)`);
    await tx.query(CREATE_LEDGER);
    await tx.query(CREATE_FUNCTION_LEDGER);
    const applied = new Map(
      (await tx.query<{ version: number; checksum: string }>(SELECT_APPLIED)).rows.map((row) => [
        Number(row.version),
        row.checksum,
      ]),
    );
    // Refuse an edited migration before anything is applied.
    for (const migration of all) {
      const checksum = applied.get(migration.version);
      if (
        checksum !== undefined &&
        checksum !== migration.checksum &&
        !superseded[migration.version]?.includes(checksum)
      ) {
        throw new Error(
          `migration ${migration.version}_${migration.name} was changed after it was applied; add a new migration instead`,
        );
      }
    }

    // A platform's own tables, met by the first migration: refused with what to map, before anything.
    if (all.some((migration) => migration.version === 1) && !applied.has(1))
      await refuseTablesOfAnotherShape(tx);
    const functionsApplied = await applyFunctionFiles(tx, functions);
    const done: number[] = [];
    for (const migration of all) {
      if (applied.has(migration.version)) continue;
      await tx.query(migration.sql);
      await tx.query(RECORD_APPLIED, [migration.version, migration.name, migration.checksum]);
      done.push(migration.version);
    }
    return { migrations: done, functions: functionsApplied };
  });
}

async function applyFunctionFiles(tx: Executor, files: FunctionFile[]): Promise<string[]> {
  const recorded = new Map(
    (await tx.query<{ name: string; checksum: string }>(SELECT_APPLIED_FUNCTIONS)).rows.map((row) => [
      row.name,
      row.checksum,
    ]),
  );
  const changed = files.filter((file) => recorded.get(file.name) !== file.checksum);
  if (changed.length === 0) return [];
  const { rows } = await tx.query<{ setting: string }>(
    "SELECT current_setting('check_function_bodies') AS setting",
  );
  // A body may name a table a pending migration creates; each body is checked when first called.
  await tx.query('SET LOCAL check_function_bodies = off');
  for (const file of changed) {
    await applyFunctionFile(tx, file);
    await tx.query(RECORD_FUNCTION, [file.name, file.checksum]);
  }
  await tx.query("SELECT set_config('check_function_bodies', $1::text, true)", [rows[0]!.setting]);
  return changed.map((file) => file.name);
}

async function overloadsOf(tx: Executor, name: string): Promise<string[]> {
  return (await tx.query<{ signature: string }>(OVERLOADS, [name])).rows.map((row) => row.signature);
}

async function applyFunctionFile(tx: Executor, file: FunctionFile): Promise<void> {
  const before = await overloadsOf(tx, file.name);
  if (before.length > 1) {
    throw new Error(
      `function file ${file.name}.sql: the database has ${before.length} functions named ${file.name} (${before.join('; ')}); drop the stale ones in a migration`,
    );
  }
  await tx.query('SAVEPOINT function_file');
  try {
    await tx.query(file.sql);
    await tx.query('RELEASE SAVEPOINT function_file');
  } catch (error) {
    if ((error as { code?: unknown }).code !== INVALID_FUNCTION_DEFINITION || before.length === 0)
      throw error;
    // The result type or an argument name changed: CREATE OR REPLACE cannot, so drop and create.
    await tx.query('ROLLBACK TO SAVEPOINT function_file');
    await dropFunction(tx, file.name, before[0]!);
    await tx.query(file.sql);
    return;
  }
  const after = await overloadsOf(tx, file.name);
  // The argument types changed: the file created a second function beside the old one.
  if (after.length > 1) for (const stale of before) await dropFunction(tx, file.name, stale);
}

async function dropFunction(tx: Executor, name: string, signature: string): Promise<void> {
  const dependents = (await tx.query<{ dependent: string }>(DEPENDENTS, [signature])).rows.map(
    (row) => row.dependent,
  );
  if (dependents.length > 0) {
    throw new Error(
      `function file ${name}.sql changes the signature of ${signature}, which ${dependents.join(', ')} depend(s) on; keep the signature, or give the new function another name`,
    );
  }
  await tx.query(`DROP FUNCTION ${signature}`);
}
