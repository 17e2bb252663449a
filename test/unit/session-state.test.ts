import { readdir, readFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { literalsOf } from '../chaos/sql-scan.ts';

/**
 * Behind a transaction-mode pooler (Neon's pooled endpoint, PgBouncer) consecutive transactions
 * of one client may run on different server connections, and a server connection passes from
 * client to client: anything a statement leaves on the *session* is lost to the next statement
 * or, worse, inherited by another client. This audit reads every SQL text that runs against the
 * database (the functions, the operator CLI, the migration runner, the migrations) for the
 * session-level constructs that break there. `npm run test:pgbouncer` then runs the suites
 * through a real PgBouncer; this catches what those runs might not reach.
 *
 * Named prepared statements need no scan: the code's only way to the database is
 * `Executor.query(text, values)`, which cannot name one (the driver then uses the unnamed
 * statement, which PgBouncer's transaction mode handles).
 */
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

const SESSION_STATE: Array<{ what: string; pattern: RegExp }> = [
  // `SET x = …` / `SET SESSION …` as a statement (not `UPDATE … SET`, not `SET LOCAL`). DateStyle
  // and TimeZone are the exception, set once per connection (SESSION_SETTINGS, database.ts): they
  // are parameters PgBouncer tracks per client and sets on each server connection it hands that
  // client, so neither is lost to the next transaction nor inherited by another client.
  {
    what: 'session SET',
    pattern: /(^|;)\s*SET\s+(?!LOCAL\b)(SESSION\s+)?(?!(DateStyle|TimeZone)\s*(=|TO\b))[\w."]+\s*(=|TO\b)/i,
  },
  { what: 'RESET', pattern: /(^|;)\s*RESET\b/i },
  { what: 'set_config(…, false): session-wide', pattern: /set_config\s*\([^)]*,\s*false\s*\)/i },
  {
    what: 'session advisory lock',
    pattern: /pg_(try_)?advisory_(un)?lock(_shared)?\s*\(|pg_advisory_unlock_all\s*\(/i,
  },
  { what: 'LISTEN / UNLISTEN', pattern: /(^|;)\s*(UN)?LISTEN\b/i },
  { what: 'SQL-level PREPARE / DEALLOCATE', pattern: /(^|;)\s*(PREPARE|DEALLOCATE)\s+\w+/i },
  { what: 'temporary table', pattern: /\bCREATE\s+(GLOBAL\s+|LOCAL\s+)?TEMP(ORARY)?\s+TABLE\b/i },
  { what: 'cursor WITH HOLD', pattern: /\bCURSOR\s+WITH\s+HOLD\b/i },
];

/** Any literal that reads like SQL (the same test the built-SQL scan uses is too narrow here). */
const LOOKS_LIKE_SQL =
  /\b(SELECT|INSERT|UPDATE|DELETE|WITH|BEGIN|COMMIT|SET|RESET|LISTEN|PREPARE|CREATE|ALTER|DO)\b/;

interface Finding {
  file: string;
  what: string;
  text: string;
}

function sessionStateIn(file: string, sqlTexts: string[]): Finding[] {
  const findings: Finding[] = [];
  for (const text of sqlTexts) {
    for (const { what, pattern } of SESSION_STATE) {
      if (pattern.test(text)) findings.push({ file, what, text: text.replace(/\s+/g, ' ').slice(0, 160) });
    }
  }
  return findings;
}

async function filesUnder(dir: string, extension: string): Promise<string[]> {
  const entries = await readdir(join(ROOT, dir), { withFileTypes: true, recursive: true });
  return entries
    .filter((entry) => entry.isFile() && entry.name.endsWith(extension))
    .map((entry) => relative(ROOT, join(entry.parentPath, entry.name)));
}

/** SQL statements of a migration file, comments removed. */
function statementsOf(sql: string): string[] {
  return sql
    .replace(/--[^\n]*/g, '')
    .split(/;\s*\n/)
    .map((statement) => statement.trim())
    .filter(Boolean);
}

describe('no session-level state, so every path works behind a transaction pooler', () => {
  it('in the SQL of the functions, the operator CLI and the migration runner', async () => {
    const files = [
      ...(await filesUnder('functions', '.ts')),
      ...(await filesUnder('infra/ops', '.ts')),
      'infra/migrate.ts',
    ];
    expect(files.length).toBeGreaterThan(40);
    let sqlTexts = 0;
    const findings: Finding[] = [];
    for (const file of files) {
      const texts = literalsOf(await readFile(join(ROOT, file), 'utf8'))
        .map((literal) => literal.text)
        .filter((text) => LOOKS_LIKE_SQL.test(text));
      sqlTexts += texts.length;
      findings.push(...sessionStateIn(file, texts));
    }
    expect(sqlTexts, 'the scan reads the code’s SQL').toBeGreaterThan(20);
    expect(findings).toEqual([]);
  });

  it('in the migrations', async () => {
    const files = await filesUnder('infra/migrations', '.sql');
    expect(files.length).toBeGreaterThan(2);
    const findings: Finding[] = [];
    for (const file of files)
      findings.push(...sessionStateIn(file, statementsOf(await readFile(join(ROOT, file), 'utf8'))));
    expect(findings).toEqual([]);
  });

  it('the audit sees each construct it looks for (and not the transaction-scoped ones)', () => {
    const flagged = [
      `SET lock_timeout = 5000`,
      `SET SESSION statement_timeout TO '1s'`,
      `BEGIN; SET search_path = x`,
      `SET DateStyle = 'ISO'; SET search_path = x`,
      `SET TimeZoneX = 'UTC'`,
      `RESET ALL`,
      `SELECT set_config('lock_timeout', '5s', false)`,
      `SELECT pg_advisory_lock(42)`,
      `SELECT pg_try_advisory_lock(42)`,
      `SELECT pg_advisory_unlock(42)`,
      `LISTEN runtime_cleaned`,
      `PREPARE claim AS SELECT 1`,
      `CREATE TEMP TABLE t (id int)`,
      `DECLARE c CURSOR WITH HOLD FOR SELECT 1`,
    ];
    for (const text of flagged) expect(sessionStateIn('sample', [text]), text).not.toEqual([]);
    const allowed = [
      `BEGIN; SET LOCAL lock_timeout = 5000; SET LOCAL statement_timeout = 15000`,
      `SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))`,
      `SELECT pg_try_advisory_xact_lock($1::bigint)`,
      `UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text`,
      `SELECT set_config('lock_timeout', '5s', true)`,
      `SET DateStyle = 'ISO, MDY'; SET TimeZone = 'UTC'`,
    ];
    for (const text of allowed) expect(sessionStateIn('sample', [text]), text).toEqual([]);
  });
});
