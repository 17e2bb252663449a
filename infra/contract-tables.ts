/**
 * Before the first migration, a platform's own tables are checked against the contract's columns
 * (docs/integration.md, section 1). Migration 001 adopts an existing `agent_runs`,
 * `conversations` or `sandbox_runtimes` as it is (CREATE TABLE IF NOT EXISTS), so a table of
 * another shape used to fail further on with PostgreSQL's own words (`column "uid" does not
 * exist`, or an index expression refused over `timestamp without time zone`), naming neither the
 * table nor what to do. This names every missing or mistyped column at once, and the page that
 * says how to map a schema onto the contract (docs/adopting.md).
 */
import type { Executor } from '../functions/adapters/database.ts';

const TEXT = 'text';
const BIGINT = 'bigint';
const INSTANT = 'timestamp with time zone';

/** The columns the cleanup reads or writes, by table, with their type as information_schema spells it. */
export const CONTRACT_COLUMNS: Readonly<Record<string, Readonly<Record<string, string>>>> = {
  agent_runs: {
    id: TEXT,
    uid: TEXT,
    conversation_id: BIGINT,
    conversation_thread_id: TEXT,
    runtime_scope_id: TEXT,
    run_type: TEXT,
    created_by_run_id: TEXT,
    status: TEXT,
    runtime_cleanup_pending: 'boolean',
    worker_id: TEXT,
    heartbeat_at: INSTANT,
    lease_expires_at: INSTANT,
    finished_at: INSTANT,
    created_at: INSTANT,
    updated_at: INSTANT,
  },
  conversations: { id: BIGINT, uid: TEXT, thread_id: TEXT, workdir_path: TEXT },
  sandbox_runtimes: {
    uid: TEXT,
    runtime_scope_id: TEXT,
    sandbox_id: TEXT,
    generation: BIGINT,
    released_at: INSTANT,
  },
};

const EXISTING_COLUMNS = `
  SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c
  WHERE c.table_schema = current_schema() AND c.table_name = ANY ($1::text[])`;

/** What is wrong with one existing table, as the refusal names it; empty when it matches. */
function mismatches(table: string, existing: ReadonlyMap<string, string>): string[] {
  const found: string[] = [];
  const missing = Object.keys(CONTRACT_COLUMNS[table]!).filter((column) => !existing.has(column));
  if (missing.length) found.push(`${table} has no column ${missing.join(', ')}`);
  for (const [column, type] of Object.entries(CONTRACT_COLUMNS[table]!)) {
    const actual = existing.get(column);
    if (actual !== undefined && actual !== type) found.push(`${table}.${column} is ${actual}, not ${type}`);
  }
  return found;
}

/**
 * Throws, naming every mismatch, when a table the contract names already exists without the
 * contract's columns; a table that does not exist yet is the migrations' to create.
 */
export async function refuseTablesOfAnotherShape(tx: Executor): Promise<void> {
  const { rows } = await tx.query<{ table_name: string; column_name: string; data_type: string }>(
    EXISTING_COLUMNS,
    [Object.keys(CONTRACT_COLUMNS)],
  );
  const tables = new Map<string, Map<string, string>>();
  for (const row of rows) {
    const columns = tables.get(row.table_name) ?? new Map<string, string>();
    columns.set(row.column_name, row.data_type);
    tables.set(row.table_name, columns);
  }
  const found = [...tables].flatMap(([table, columns]) => mismatches(table, columns));
  if (found.length) {
    throw new Error(
      `the database's own tables are not the runtime-cleanup contract's: ${found.join('; ')}. Map them onto the contract first (docs/adopting.md), then migrate again; nothing was applied`,
    );
  }
}
