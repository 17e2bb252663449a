/**
 * The files the tcp and PgBouncer passes leave out (test/support/driver-passes.ts) must be files
 * that never open the test database: otherwise a pass would skip a test whose result depends on
 * the database path it exists to prove.
 */
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  DatabasePass,
  DRIVER_FREE_FILES,
  databasePass,
  filesLeftOutOf,
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

  it('npm test leaves nothing out; the tcp pass the driver-free files; the pooler pass the bundles too', () => {
    expect(filesLeftOutOf(databasePass({}))).toEqual([]);
    const driver = filesLeftOutOf(databasePass({ RUNTIME_CLEANUP_TEST_PASS: 'driver' }));
    expect(driver).toEqual(Object.keys(DRIVER_FREE_FILES));
    const pooler = filesLeftOutOf(databasePass({ RUNTIME_CLEANUP_TEST_PASS: DatabasePass.POOLER }));
    expect(pooler).toEqual([...driver, ...Object.keys(POOLER_PASS_ALSO_LEAVES_OUT)]);
    expect(() => databasePass({ RUNTIME_CLEANUP_TEST_PASS: 'tcp' })).toThrow(
      /must be "driver", "pooler" or unset/,
    );
  });

  it('the test scripts name their pass', () => {
    const scripts = JSON.parse(readFileSync(`${ROOT}package.json`, 'utf8')).scripts as Record<string, string>;
    expect(scripts['test:tcp']).toContain('RUNTIME_CLEANUP_TEST_PASS=driver');
    expect(scripts['test:pgbouncer']).toContain('RUNTIME_CLEANUP_TEST_PASS=pooler');
    expect(scripts.test).not.toContain('RUNTIME_CLEANUP_TEST_PASS');
  });
});
