/**
 * One home for each rule (issue 23): a static scan of the repository's SQL and TypeScript that
 * fails when a second definition of a shared rule appears where the first is meant to be called.
 * Each scanner is shown to find what it looks for, so a clean result means something.
 */
import { readdir, readFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { FUNCTIONS_DIR, functionsCreatedIn, loadFunctionFiles, loadMigrations } from '../../infra/migrate.ts';
import {
  NON_TERMINAL_RUN_STATUSES,
  TERMINAL_RUN_STATUSES,
  terminalStatusesIn,
} from '../../infra/run-statuses.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
/** Generated from the files it is scanned against. */
const GENERATED = new Set(['infra/schema.sql']);

async function filesUnder(dir: string, extensions: readonly string[]): Promise<string[]> {
  const entries = await readdir(join(ROOT, dir), { withFileTypes: true, recursive: true });
  return entries
    .filter((entry) => entry.isFile() && extensions.some((extension) => entry.name.endsWith(extension)))
    .map((entry) => relative(ROOT, join(entry.parentPath, entry.name)))
    .filter((path) => !path.includes('node_modules') && !GENERATED.has(path))
    .sort();
}

async function sources(): Promise<Array<{ path: string; text: string }>> {
  const paths = [
    ...(await filesUnder('infra', ['.sql', '.ts'])),
    ...(await filesUnder('functions', ['.ts'])),
    ...(await filesUnder('bench', ['.ts'])),
    ...(await filesUnder('test', ['.ts'])),
  ];
  return Promise.all(paths.map(async (path) => ({ path, text: await readFile(join(ROOT, path), 'utf8') })));
}

/**
 * Lines that start a literal list of the terminal statuses: every one of them, quoted, within five
 * lines (an SQL `IN (…)`, an array, a union type, however it is wrapped).
 */
function terminalListsIn(text: string): number[] {
  const lines = text.split('\n');
  const quoted = (line: string, status: string) =>
    line.includes(`'${status}'`) || line.includes(`"${status}"`);
  const found: number[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!TERMINAL_RUN_STATUSES.some((status) => quoted(lines[i]!, status))) continue;
    const window = lines.slice(i, i + 5);
    if (TERMINAL_RUN_STATUSES.every((status) => window.some((line) => quoted(line, status)))) {
      found.push(i + 1);
      i += 4;
    }
  }
  return found;
}

/** Lines that decide "released" from `released_at` alone, in SQL text (comments aside). */
function releasedAtTestsIn(text: string): number[] {
  return text.split('\n').flatMap((line, index) => {
    const comment = /^\s*(--|\/\/|\*|\/\*)/.test(line);
    return !comment && /released_at\s+IS\s+NOT\s+NULL/i.test(line) ? [index + 1] : [];
  });
}

/** The decision functions: each refuses any isolation but READ COMMITTED before anything else. */
const DECISION_FUNCTIONS = [
  'runtime_cleanup_fence_check',
  'runtime_cleanup_begin_release',
  'runtime_cleanup_finalize',
  'runtime_cleanup_force_clear',
  'runtime_cleanup_begin_reclaim',
];

/**
 * The SQL functions a statement may not call outside a pinned transaction: every one not declared
 * STABLE or IMMUTABLE (PostgreSQL's default is VOLATILE), i.e. every one that may write or lock.
 */
async function volatileFunctions(): Promise<string[]> {
  return (await loadFunctionFiles())
    .filter(
      ({ sql }) =>
        !/\b(STABLE|IMMUTABLE)\b/.test(sql.slice(0, sql.indexOf('AS $$')).replace(/--[^\n]*/g, '')),
    )
    .map(({ name }) => name);
}

/**
 * Whether a statement writes (or locks rows, or calls a volatile SQL function): what must run in
 * the transaction that pins READ COMMITTED, where an UPDATE that waited on a row re-checks it
 * instead of failing with SQLSTATE 40001 under a REPEATABLE READ or SERIALIZABLE default.
 */
function writes(statement: string, volatile: readonly string[]): boolean {
  const code = statement.replace(/--[^\n]*/g, '');
  return (
    /\b(INSERT|UPDATE|DELETE|MERGE|TRUNCATE)\b|\bFOR\s+(NO\s+KEY\s+)?UPDATE\b|\bFOR\s+(KEY\s+)?SHARE\b/i.test(
      code,
    ) || volatile.some((name) => new RegExp(`\\b${name}\\s*\\(`, 'i').test(code))
  );
}

/**
 * Every statement a source sends through `.query(…)` or `.queryOnce(…)` (a plain statement, run
 * at the session's default isolation), with the first argument resolved: a string literal, or
 * the name of a string constant of the same file. `statement` is undefined when it cannot be
 * resolved (a variable): such a send must be on PLAIN_SENDS.
 */
function plainSendsIn(text: string): Array<{ line: number; call: string; statement: string | undefined }> {
  const constants = new Map(
    [...text.matchAll(/\bconst\s+(\w+)\s*=\s*(`[^`]*`|'[^']*'|"[^"]*")/g)].map((m) => [
      m[1]!,
      m[2]!.slice(1, -1),
    ]),
  );
  return [
    ...text.matchAll(
      /([\w.]+)\.(query|queryOnce)\s*(?:<[\s\S]*?>)?\s*\(\s*(`[^`]*`|'[^']*'|"[^"]*"|[\w.]+)/g,
    ),
  ].map((m) => {
    const argument = m[3]!;
    const statement = /^[`'"]/.test(argument) ? argument.slice(1, -1) : constants.get(argument);
    const call = `${m[1]}.${m[2]}(${/^[`'"]/.test(argument) ? '…' : argument})`;
    return { line: text.slice(0, m.index).split('\n').length, call, statement };
  });
}

/**
 * The plain sends in functions/ that are not the product's statements: the adapter's own generic
 * sends, which carry whatever `query`, `transact` and `withTransaction` were given (BEGIN … COMMIT
 * included), and are checked where those are called.
 */
const PLAIN_SENDS: Readonly<Record<string, { count: number; why: string }>> = {
  'functions/adapters/database.ts client.query(text)': {
    count: 2,
    why: "`send`, behind query, queryOnce and withTransaction (checked at their callers), and `sendMany`, the one-message transaction's own send (it begins READ COMMITTED)",
  },
};

describe('one definition of each shared rule', () => {
  it('spells the terminal statuses out once, in SQL; the TypeScript list is read from there', async () => {
    const hits = (await sources()).flatMap(({ path, text }) =>
      terminalListsIn(text).map((line) => `${path}:${line}`),
    );
    expect(hits).toEqual(['infra/sql/runtime_cleanup_status_is_active.sql:28']);
    // The scanner finds a TypeScript spelling too (the one this list replaced).
    const spelled = TERMINAL_RUN_STATUSES.map((status) => `'${status}'`).join(', ');
    expect(terminalListsIn(`export const LIST = [${spelled}];`)).toEqual([1]);
    const definition = await readFile(join(FUNCTIONS_DIR, 'runtime_cleanup_status_is_active.sql'), 'utf8');
    const list = /status NOT IN \(([^)]*)\)/.exec(definition.replace(/--[^\n]*/g, ''))![1]!;
    expect([...list.matchAll(/'([^']*)'/g)].map((match) => match[1])).toEqual([...TERMINAL_RUN_STATUSES]);
    for (const status of NON_TERMINAL_RUN_STATUSES) expect(list).not.toContain(`'${status}'`);
  });

  it('reads the terminal statuses from the definition, and refuses a definition without the list', () => {
    expect(TERMINAL_RUN_STATUSES).toHaveLength(4);
    expect(TERMINAL_RUN_STATUSES).toContain('interrupted');
    expect(
      terminalStatusesIn(
        "-- status NOT IN ('x')\nAS $$ SELECT status IS NULL OR status NOT IN ('done', 'gone') $$;",
      ),
    ).toEqual(['done', 'gone']);
    expect(() => terminalStatusesIn('AS $$ SELECT status IS NULL $$;')).toThrow(/status NOT IN/);
  });

  it('decides "released" only through runtime_cleanup_generation_released in product code', async () => {
    const product = (await sources()).filter(({ path }) => !path.startsWith('test/'));
    const hits = product.flatMap(({ path, text }) =>
      releasedAtTestsIn(text).map((line) => `${path}:${line}`),
    );
    expect(hits).toEqual(['infra/sql/runtime_cleanup_generation_released.sql:21']);
  });

  it('defines each SQL function in one file: infra/sql/<name>.sql, and none in a migration', async () => {
    const files = await loadFunctionFiles();
    expect(files.length).toBeGreaterThan(15);
    for (const migration of await loadMigrations()) {
      expect(functionsCreatedIn(migration.sql), `${migration.version}_${migration.name}`).toEqual([]);
    }
    const definedIn = new Map<string, string[]>();
    for (const { path, text } of await sources()) {
      for (const name of functionsCreatedIn(text))
        definedIn.set(name, [...(definedIn.get(name) ?? []), path]);
    }
    const twice = [...definedIn].filter(([, paths]) => paths.length > 1);
    expect(twice).toEqual([]);
    for (const file of files) expect(definedIn.get(file.name)).toEqual([`infra/sql/${file.name}.sql`]);
  });

  it('has every decision function check the isolation level first', async () => {
    const files = new Map((await loadFunctionFiles()).map((file) => [file.name, file.sql]));
    for (const name of DECISION_FUNCTIONS) {
      const sql = files.get(name)!;
      const body = sql.slice(sql.indexOf('AS $$')).split(/\bBEGIN\b/)[1]!;
      expect(body.trimStart().startsWith('PERFORM runtime_cleanup_require_read_committed();'), name).toBe(
        true,
      );
    }
    // Whatever takes a scope's lock is a decision, or the lock helper only decisions call.
    const callers = (pattern: RegExp) =>
      [...files].filter(([, sql]) => pattern.test(sql.slice(sql.indexOf('AS $$')))).map(([name]) => name);
    const locking = callers(/pg_advisory_xact_lock\(runtime_cleanup_lock_key/);
    expect(locking.filter((name) => !DECISION_FUNCTIONS.includes(name))).toEqual([
      'runtime_cleanup_lock_run',
    ]);
    const helped = callers(/runtime_cleanup_lock_run\(/).filter(
      (name) => name !== 'runtime_cleanup_lock_run',
    );
    expect(helped.filter((name) => !DECISION_FUNCTIONS.includes(name))).toEqual([]);
    expect([...locking, ...helped].sort()).toEqual(
      [...DECISION_FUNCTIONS, 'runtime_cleanup_lock_run'].sort(),
    );
  });

  it('sends every write of functions/ through the transaction that pins READ COMMITTED, never as a plain statement', async () => {
    const volatile = await volatileFunctions();
    expect(volatile).toEqual(
      expect.arrayContaining(['runtime_cleanup_end_reclaim', 'runtime_cleanup_settings_of_record']),
    );
    const product = (await sources()).filter(({ path }) => path.startsWith('functions/'));
    const found: string[] = [];
    const generic = new Map<string, string[]>();
    for (const { path, text } of product) {
      for (const send of plainSendsIn(text)) {
        const where = `${path}:${send.line} ${send.call}`;
        if (send.statement === undefined) {
          const key = `${path} ${send.call}`;
          generic.set(key, [...(generic.get(key) ?? []), where]);
        } else if (writes(send.statement, volatile)) {
          found.push(where);
        }
      }
    }
    // A write found here belongs in Database.transact, which begins READ COMMITTED
    // (beginTransactionStatement) whatever default_transaction_isolation says. (None of functions/
    // uses withTransaction; a `tx.query` write inside one would be pinned too, but reads here like
    // a plain send: it would need an entry of its own, with its reason.)
    expect(found).toEqual([]);
    // A send whose statement is a variable is allowed only as the adapter's own, as many times as
    // listed: a new one (or a stale entry) shows here.
    expect(Object.fromEntries([...generic].map(([key, sends]) => [key, sends.length]))).toEqual(
      Object.fromEntries(Object.entries(PLAIN_SENDS).map(([key, { count }]) => [key, count])),
    );
  });

  it('the scanners find what they look for', () => {
    const list = TERMINAL_RUN_STATUSES.map((status) => `'${status}'`);
    expect(terminalListsIn(`x\nWHERE status NOT IN (${list.join(', ')})`)).toEqual([2]);
    expect(terminalListsIn(`const t = [\n  ${list.join(',\n  ')},\n];`)).toEqual([2]);
    expect(terminalListsIn(`type T = ${list.join(' | ').replaceAll("'", '"')};`)).toEqual([1]);
    expect(
      terminalListsIn(`${list.slice(0, 3).join(', ')}\n-- completed, failed, cancelled, interrupted`),
    ).toEqual([]);
    expect(
      releasedAtTestsIn('SELECT 1\nWHERE s.released_at is not null\n-- released_at IS NOT NULL'),
    ).toEqual([2]);
    expect(releasedAtTestsIn('SET released_at = now() WHERE released_at IS NULL')).toEqual([]);
    const volatile = ['runtime_cleanup_end_reclaim'];
    const sent = plainSendsIn(
      [
        'const CLAIM = `UPDATE agent_runs SET x = 1`;',
        "const READ = 'SELECT updated_at, delete_in_flight_until FROM t -- UPDATE in a comment';",
        'await db.query(CLAIM, [1]);',
        'await db.query<{ id: string }>(READ);',
        "await db.queryOnce('SELECT * FROM runtime_cleanup_end_reclaim($1::text)', [t]);",
        'await client.query(text, values);',
        'await db.transact(CLAIM);',
      ].join('\n'),
    );
    expect(
      sent.map(({ line, call, statement }) => [
        line,
        call,
        statement !== undefined && writes(statement, volatile),
      ]),
    ).toEqual([
      [3, 'db.query(CLAIM)', true],
      [4, 'db.query(READ)', false],
      [5, 'db.queryOnce(…)', true],
      [6, 'client.query(text)', false],
    ]);
    expect(sent[3]!.statement).toBeUndefined();
    expect(writes('SELECT id FROM agent_runs FOR UPDATE SKIP LOCKED', [])).toBe(true);
    expect(writes('INSERT INTO s VALUES (1) ON CONFLICT DO NOTHING', [])).toBe(true);
    expect(writes('SELECT runtime_cleanup_generation_released(a, b, c, d, e)', volatile)).toBe(false);
    expect(functionsCreatedIn('-- CREATE FUNCTION a()\nCREATE OR REPLACE FUNCTION public.b(x int)')).toEqual([
      'b',
    ]);
  });
});
