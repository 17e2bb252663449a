/**
 * The files the tcp and PgBouncer passes leave out (test/support/driver-passes.ts) must be files
 * that never open the test database: otherwise a pass would skip a test whose result depends on
 * the database path it exists to prove.
 */
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  allPassesRequested,
  DatabasePass,
  DRIVER_FREE_FILES,
  databasePass,
  EXTRA_PASSES,
  filesLeftOutOf,
  OWN_DRIVER_FILES,
  type OwnDriverFile,
  POOLER_PASS_ALSO_LEAVES_OUT,
} from '../support/driver-passes.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The ways a test reaches the suite's database: every one goes through test/support. */
const DATABASE_ENTRY_POINTS = [
  /\bcreateTestDatabase\(/,
  /\buseDatabaseFixture\(/,
  /\buseProvisionerFixture\(/,
  /\buseStackFixture\(/,
  /\bstartTestStack\(/,
];
const INJECT_DATABASE = /\binject\(\s*['"]database['"]\s*\)/;

function entryPointsIn(source: string, allowInject: boolean): string[] {
  const found = DATABASE_ENTRY_POINTS.filter((pattern) => pattern.test(source)).map(String);
  if (!allowInject && INJECT_DATABASE.test(source)) found.push(String(INJECT_DATABASE));
  return found;
}

/** A top-level block the scan can read: `describe`, `it` or `test`, maybe `.each(<list>)`, then a plain title. */
const READABLE_BLOCK = /^(?:describe|it|test)(?:\.each\(([^)]*)\))?\(\s*(['"`])((?:(?!\2).)*)\2/;
/** Whatever opens a top-level block, with any modifiers (`.skipIf(…)`, `.concurrent`, `.for`…). */
const BLOCK_START = /^(?:describe|it|test)\b.*$/gm;
/** What reads the pass's own driver or path: a file that does is about the pass, and runs in each. */
const READS_THE_PASS = /\bsuiteDriver\(|process\.env\.DATABASE_(?:DRIVER|POOLER)\b/;

type Block = { each: string | null; title: string } | { unreadable: string };

/** A test file's top-level blocks (at the start of a line): what `.each` iterates over, and the title. */
function topLevelBlocks(source: string): Block[] {
  return [...source.matchAll(BLOCK_START)].map((start) => {
    const match = READABLE_BLOCK.exec(source.slice(start.index));
    // A modifier the scan does not know, or a title built at run time, is not read as anything.
    if (!match || match[3]!.includes('${')) return { unreadable: start[0] };
    return { each: match[1] ?? null, title: match[3]! };
  });
}

/** Why a file does not choose each test's driver itself: each block that neither iterates nor names one. */
function blocksOnTheSuiteDriver(source: string, file: OwnDriverFile): string[] {
  const blocks = topLevelBlocks(source);
  const found: string[] = [];
  if (!blocks.some((block) => 'each' in block && block.each === 'DATABASE_DRIVERS'))
    found.push('no describe.each(DATABASE_DRIVERS)');
  for (const block of blocks) {
    if ('unreadable' in block) found.push(`unreadable: ${block.unreadable}`);
    else if (block.each === 'DATABASE_DRIVERS' || /\b(neon|tcp) driver\b/.test(block.title)) continue;
    else if (!(block.title in (file.blocks ?? {}))) found.push(block.title);
  }
  const reads = READS_THE_PASS.exec(source);
  if (reads) found.push(`reads the pass's own path: ${reads[0]}`);
  return found;
}

describe('the files that choose their tests’ driver themselves (the tcp pass leaves them out)', () => {
  it('iterate over the drivers or name one in every top-level block; an own-server file opens no test database', () => {
    for (const [file, entry] of Object.entries(OWN_DRIVER_FILES)) {
      expect(existsSync(`${ROOT}${file}`), file).toBe(true);
      expect(entry.reason.length, file).toBeGreaterThan(10);
      expect(file in DRIVER_FREE_FILES, file).toBe(false);
      const source = readFileSync(`${ROOT}${file}`, 'utf8');
      expect(blocksOnTheSuiteDriver(source, entry), file).toEqual([]);
      // An exception names a block that is there, with its reason.
      const titles = topLevelBlocks(source).flatMap((block) => ('title' in block ? [block.title] : []));
      for (const [title, why] of Object.entries(entry.blocks ?? {})) {
        expect(titles, file).toContain(title);
        expect(why.length, `${file}: ${title}`).toBeGreaterThan(10);
      }
      // Of the suite's database an own-server file may read the bridge's address and the driver
      // of its setup, never where the suite's database or its pooler is.
      if (entry.ownServer) {
        expect(entryPointsIn(source, true), file).toEqual([]);
        expect(source, file).not.toMatch(/\b(adminUrl|poolerPort)\b/);
      }
    }
  });

  it('the scan sees a file with a block on the suite’s driver, or none over each driver (the control)', () => {
    const roundTrips = readFileSync(`${ROOT}test/integration/phase-round-trips.test.ts`, 'utf8');
    expect(blocksOnTheSuiteDriver(roundTrips, { reason: '' })).toEqual([
      'the benchmark’s lock-hold clock, on a database with its instrumented copies',
    ]);
    const finalize = readFileSync(`${ROOT}test/integration/finalize.test.ts`, 'utf8');
    expect(blocksOnTheSuiteDriver(finalize, { reason: '' })).toContain('no describe.each(DATABASE_DRIVERS)');
    // pooler.test.ts iterates over the drivers too, but one of its blocks checks the pass's own driver.
    const pooler = readFileSync(`${ROOT}test/integration/pooler.test.ts`, 'utf8');
    expect(blocksOnTheSuiteDriver(pooler, { reason: '' })).toEqual([
      "is the path and driver this project's environment names (a pass merged into one run must not run direct)",
      "reads the pass's own path: process.env.DATABASE_POOLER",
    ]);
    // The word alone is no driver's name; a modifier or a title made at run time is not read at all.
    const file = (...blocks: string[]) =>
      blocksOnTheSuiteDriver(
        ["describe.each(DATABASE_DRIVERS)('over the %s driver', () => {});", ...blocks].join('\n'),
        {
          reason: '',
        },
      );
    expect(file("it('the suite driver is used', () => {});")).toEqual(['the suite driver is used']);
    expect(file("it('over the tcp driver: x', () => {});")).toEqual([]);
    expect(file("describe.concurrent('over the tcp driver', () => {});")).toEqual([
      "unreadable: describe.concurrent('over the tcp driver', () => {});",
    ]);
    expect(file("describe.skipIf(x)('over the tcp driver', () => {});")).toHaveLength(1);
    expect(file(`describe(\`over the \${driver} driver\`, () => {});`)).toHaveLength(1);
    expect(file("describe.each(DATABASE_DRIVERS.slice(1))('over the %s driver', () => {});")).toHaveLength(1);
    // A multi-line title is read as the block's title.
    expect(
      topLevelBlocks("describe.each(DATABASE_DRIVERS)(\n  'over the %s driver: x',\n  (d) => {})"),
    ).toEqual([{ each: 'DATABASE_DRIVERS', title: 'over the %s driver: x' }]);
  });
});

describe('the files the database passes leave out', () => {
  it('exist, and open no test database (a child-only use is named as such)', () => {
    for (const [file, { reason, childrenOnly }] of Object.entries(DRIVER_FREE_FILES)) {
      expect(existsSync(`${ROOT}${file}`), file).toBe(true);
      expect(reason.length, file).toBeGreaterThan(10);
      const source = readFileSync(`${ROOT}${file}`, 'utf8');
      expect(entryPointsIn(source, childrenOnly === true), file).toEqual([]);
    }
    for (const file of Object.keys(POOLER_PASS_ALSO_LEAVES_OUT))
      expect(existsSync(`${ROOT}${file}`), file).toBe(true);
  });

  it('the scan sees a file that opens the database (the control)', () => {
    for (const file of [
      'test/integration/finalize.test.ts',
      'test/e2e/cleanup-flow.test.ts',
      'test/integration/pooler.test.ts',
    ]) {
      const source = readFileSync(`${ROOT}${file}`, 'utf8');
      expect(entryPointsIn(source, false), file).not.toEqual([]);
    }
  });

  it('npm test leaves nothing out; the tcp pass the driver-free and own-driver files; the pooler pass the driver-free, own-server and bundle files', () => {
    expect(filesLeftOutOf(databasePass({}))).toEqual([]);
    const driver = filesLeftOutOf(databasePass({ RUNTIME_CLEANUP_TEST_PASS: 'driver' }));
    expect(driver).toEqual([...Object.keys(DRIVER_FREE_FILES), ...Object.keys(OWN_DRIVER_FILES)]);
    const pooler = filesLeftOutOf(databasePass({ RUNTIME_CLEANUP_TEST_PASS: DatabasePass.POOLER }));
    expect(pooler).toEqual([
      ...Object.keys(DRIVER_FREE_FILES),
      'test/integration/database-no-password.test.ts',
      'test/integration/database-url-secret.test.ts',
      ...Object.keys(POOLER_PASS_ALSO_LEAVES_OUT),
    ]);
    // A file that reaches the suite's database runs behind the pooler, whoever picks its driver.
    expect(pooler).not.toContain('test/integration/database-survival.test.ts');
    expect(() => databasePass({ RUNTIME_CLEANUP_TEST_PASS: 'tcp' })).toThrow(
      /must be "driver", "pooler" or unset/,
    );
  });

  it('the test scripts name their pass', () => {
    const scripts = JSON.parse(readFileSync(`${ROOT}package.json`, 'utf8')).scripts as Record<string, string>;
    expect(scripts['test:tcp']).toContain('RUNTIME_CLEANUP_TEST_PASS=driver');
    expect(scripts['test:pgbouncer']).toContain('RUNTIME_CLEANUP_TEST_PASS=pooler');
    // A pass run alone sets what its projects in the one CI run set (EXTRA_PASSES): the two cannot drift.
    for (const [script, pass] of [
      ['test:tcp', DatabasePass.DRIVER],
      ['test:pgbouncer', DatabasePass.POOLER],
    ] as const) {
      for (const [name, value] of Object.entries(EXTRA_PASSES[pass].env)) {
        expect(scripts[script], script).toContain(`${name}=${value}`);
      }
    }
    expect(scripts.test).not.toContain('RUNTIME_CLEANUP_TEST_PASS');
  });
});

describe('every pass in one run (RUNTIME_CLEANUP_TEST_PASSES=all, what .ci/run sets)', () => {
  interface ProjectShape {
    test: { name: string; include: string[]; exclude?: string[]; env?: Record<string, string> };
  }

  async function projectsWith(passes: string | undefined): Promise<Map<string, ProjectShape['test']>> {
    vi.resetModules();
    vi.stubEnv('RUNTIME_CLEANUP_TEST_PASSES', passes);
    vi.stubEnv('RUNTIME_CLEANUP_TEST_PASS', undefined);
    vi.stubEnv('RUNTIME_CLEANUP_TEST_FIXTURE', undefined);
    const config = (await import('../../vitest.config.ts')).default as {
      test: { projects: ProjectShape[]; env: Record<string, string>; maxWorkers: number };
    };
    return new Map(config.test.projects.map((project) => [project.test.name, project.test]));
  }

  afterEach(() => {
    vi.unstubAllEnvs();
    vi.resetModules();
  });

  it('adds each tier of each pass as a project with its path and its files left out', async () => {
    const projects = await projectsWith('all');
    for (const [suffix, pass, path] of [
      ['tcp', DatabasePass.DRIVER, { DATABASE_DRIVER: 'tcp' }],
      ['pgbouncer', DatabasePass.POOLER, { DATABASE_POOLER: 'pgbouncer' }],
    ] as const) {
      for (const tier of ['integration', 'e2e']) {
        const project = projects.get(`${tier}-${suffix}`);
        expect(project, `${tier}-${suffix}`).toBeDefined();
        expect(project!.include).toEqual([`test/${tier}/**/*.test.ts`]);
        expect(project!.env).toMatchObject(path);
        for (const file of filesLeftOutOf(pass)) expect(project!.exclude).toContain(file);
      }
    }
    // The default pass is still every file over the suite's driver.
    expect(projects.get('integration')!.exclude ?? []).not.toContain(Object.keys(DRIVER_FREE_FILES)[0]);
    expect(projects.get('integration')!.env).not.toHaveProperty('DATABASE_POOLER');
  });

  it('is one pass without it, and refuses a value it does not know', async () => {
    const projects = await projectsWith(undefined);
    expect([...projects.keys()].filter((name) => name.includes('-'))).toEqual([]);
    expect(allPassesRequested({ RUNTIME_CLEANUP_TEST_PASSES: ' all ' })).toBe(true);
    expect(() => allPassesRequested({ RUNTIME_CLEANUP_TEST_PASSES: 'tcp' })).toThrow(
      /must be "all" or unset/,
    );
  });

  it(".ci/run runs the README's command with it, and the scripts that command starts do not inherit it", async () => {
    const ci = readFileSync(`${ROOT}.ci/run`, 'utf8');
    expect(ci).toMatch(
      /^RUNTIME_CLEANUP_TEST_PASSES=all run_tests "[^"]+" npm test \|\| tests_status=\$\?$/m,
    );
    const root = (await import('../../vitest.config.ts')).default as {
      test: { env: Record<string, string> };
    };
    expect(root.test.env.RUNTIME_CLEANUP_TEST_PASSES).toBe('');
  });
});
