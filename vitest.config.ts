/**
 * Six tiers, one Vitest project each (`npm run test:<tier>`; `npm test` runs all but platform):
 *
 * - unit: the product's pure logic. No database, no global setup, and no sockets
 *   (test/support/no-network.ts makes opening one fail the test), so it runs in seconds anywhere.
 * - harness: the test and benchmark machinery's own logic (the chaos suite's invariants and
 *   checkers, the benchmark's reports, the test support's processes), on the same terms as unit:
 *   what proves the product is kept apart from what proves the tools that prove it.
 * - integration: the phases against a real PostgreSQL and real local HTTP servers.
 * - e2e: through the local stack (SQS emulator, provisioner, handlers) and the real CLIs.
 * - chaos: the seeded fault-injection suite and its harness.
 * - platform: through the local stack against a real FastAPI provisioner that behaves as the
 *   platform's does (test/platform/fastapi-provisioner/app.py), and the Python examples of
 *   docs/adopting.md (examples/python/). It needs Debian's python3-fastapi, python3-uvicorn,
 *   python3-boto3 and python3-psycopg2, which a new clone may lack: `npm test` leaves it out,
 *   `.ci/run` installs them and runs `npm run test:platform` beside `npm test`.
 *
 * All but unit share one PostgreSQL per run (test/support/global-setup.ts), and one driver:
 * DATABASE_DRIVER, else neon (test/support/suite-driver.ts), set in their workers' environment so
 * that every command a test starts inherits it. `npm run test:tcp` runs integration and e2e over tcp,
 * `npm run test:pgbouncer` through PgBouncer, each without the files that cannot depend on the
 * database path (test/support/driver-passes.ts). With RUNTIME_CLEANUP_TEST_PASSES=all (`.ci/run`),
 * `npm test` holds both passes too, as the projects integration-tcp, e2e-tcp, integration-pgbouncer
 * and e2e-pgbouncer, and the global setup gives each project its driver and path.
 *
 * RUNTIME_CLEANUP_TEST_FIXTURE=<name> swaps every tier's tests for the fixture files
 * test/fixtures/<name>/<tier>.test.ts: the exit-status check runs the real scripts on a fixture
 * that is known to fail (or to pass) and expects their exit status. Normal runs never include them.
 */
import { configDefaults, defineConfig } from 'vitest/config';
import { compileCacheDir } from './test/support/compile-cache.ts';
import {
  allPassesRequested,
  DatabasePass,
  databasePass,
  EXTRA_PASSES,
  filesLeftOutOf,
} from './test/support/driver-passes.ts';
import LongFilesFirstSequencer from './test/support/sequencer.ts';
import { suiteDriver } from './test/support/suite-driver.ts';

/**
 * A suite starts some 700 Node processes (workers, npm, osls, the commands), most of them loading
 * the same modules: Node's compile cache keeps their compiled code between them (a
 * refused `npm run package` 2.5 → 2.2 CPU-s). Set here, in Vitest's main process, so that the
 * workers and every process they start inherit it; a changed source is compiled again. In
 * `.cache/` (gitignored), beside the typecheck's build info, pruned (test/support/compile-cache.ts).
 */
process.env.NODE_COMPILE_CACHE ??= compileCacheDir();

const DATABASE_SETUP = ['test/support/global-setup.ts'];
/**
 * The integration and e2e files share their workers' module caches (`isolate: false`): a fresh
 * worker per file spent about a second of CPU a file loading the same modules again (the
 * integration pass alone: 267 CPU-s isolated, 205 shared, every test passing both ways). Each file
 * makes its own database, servers and stack and ends them; what it changes in process.env is undone
 * after it (one-file-at-a-time.ts).
 */
const ALL_PASSES = allPassesRequested();
/**
 * In a merged run the chaos tier runs beside the others, which yield the CPU to it
 * (test/support/cpu-priority.ts): every other tier's workers start with this setup file.
 */
const YIELD_CPU = ALL_PASSES ? ['test/support/yield-cpu-setup.ts'] : [];
/** Tiers whose files share their workers: every file's own setup, then its environment restored after it. */
const sharedWorkers = (...setupFiles: string[]) => ({
  isolate: false,
  setupFiles: [...YIELD_CPU, ...setupFiles, 'test/support/one-file-at-a-time.ts'],
});
const SHARED_WORKERS = sharedWorkers();
/**
 * The unit and harness files share their workers too: a fork per file cost about 0.3 s of CPU a
 * file to start and load the same modules, more than most of these files take to run.
 */
const NO_NETWORK = sharedWorkers('test/support/no-network.ts');
const DATABASE_ENV = { DATABASE_DRIVER: suiteDriver() };
const fixture = process.env.RUNTIME_CLEANUP_TEST_FIXTURE;
// `npm run test:tcp` and `npm run test:pgbouncer` leave out what cannot depend on the database path
// (test/support/driver-passes.ts); `npm test` runs every file.
const LEFT_OUT_OF_THIS_PASS = [...configDefaults.exclude, ...filesLeftOutOf(databasePass())];

function tier(
  name: string,
  include: string[],
  extra: {
    globalSetup?: string[];
    setupFiles?: string[];
    sequence?: { groupOrder: number };
    fileParallelism?: boolean;
    isolate?: boolean;
    env?: Record<string, string>;
    exclude?: string[];
  } = {},
) {
  return {
    extends: true,
    test: {
      name,
      include: fixture ? [`test/fixtures/${fixture}/${name.split('-')[0]}.test.ts`] : include,
      ...extra,
    },
  };
}

export default defineConfig({
  test: {
    projects: [
      tier('unit', ['test/unit/**/*.test.ts'], NO_NETWORK),
      tier('harness', ['test/harness/**/*.test.ts'], NO_NETWORK),
      tier('integration', ['test/integration/**/*.test.ts'], {
        globalSetup: DATABASE_SETUP,
        env: DATABASE_ENV,
        exclude: LEFT_OUT_OF_THIS_PASS,
        ...SHARED_WORKERS,
      }),
      tier('e2e', ['test/e2e/**/*.test.ts'], {
        globalSetup: DATABASE_SETUP,
        env: DATABASE_ENV,
        exclude: LEFT_OUT_OF_THIS_PASS,
        ...SHARED_WORKERS,
      }),
      // RUNTIME_CLEANUP_TEST_PASSES=all: the tcp and PgBouncer passes as projects of this run.
      ...(ALL_PASSES ? extraPassProjects() : []),
      // The chaos suite checks a convergence bound in seconds, which holds on two cores shared with
      // one engine's 20 runs, not with every e2e stack of the other tiers at the same priority (seen:
      // 32.7 s against the 26.5 s bound), nor with the second engine of coverage.test.ts (with both
      // at once, fault-free DELETEs missed their 1 s timeout and each miss kept the scope
      // quarantined 11 s more). The engines take turns (test/chaos/engine-lock.ts). Alone, the tier
      // runs after the others, one file at a time; in a merged run it runs beside them, and they
      // yield the CPU to it (test/support/cpu-priority.ts): its 90 s no longer end the run.
      tier('chaos', ['test/chaos/**/*.test.ts'], {
        globalSetup: DATABASE_SETUP,
        env: DATABASE_ENV,
        ...(ALL_PASSES
          ? { setupFiles: ['test/support/full-cpu-setup.ts'] }
          : { sequence: { groupOrder: 1 }, fileParallelism: false }),
      }),
      tier('platform', ['test/platform/**/*.test.ts'], { globalSetup: DATABASE_SETUP, env: DATABASE_ENV }),
    ],
    pool: 'forks',
    // The long files first, by their recorded durations, so that a run does not end on one of them.
    sequence: { sequencer: LongFilesFirstSequencer },
    // Two for one pass on two cores. Three passes in one run wait more than they compute (SQS
    // visibility timeouts, backoffs, child processes starting), so more workers fill those waits;
    // with the chaos tier beside the others one of them is its engine, mostly waiting too, and one
    // the other engine's file waiting for its turn: six (a merged run 361.6 s with four, 341.4 s
    // and later 323.3 s with five, 303.1 s with six, at most 67 of PostgreSQL's 100 connections;
    // eight ran PostgreSQL out of them).
    maxWorkers: ALL_PASSES ? 6 : 2,
    testTimeout: 60_000,
    hookTimeout: 120_000,
    reporters: ['default'],
    // EMF lines of every handler would flood the test output; tests about metrics turn them on.
    env: {
      POWERTOOLS_METRICS_DISABLED: 'true',
      NODE_OPTIONS: '--disable-warning=ExperimentalWarning',
      // The run's passes are this run's: a test script a test starts (test-scripts-exit-status)
      // runs its own one pass.
      RUNTIME_CLEANUP_TEST_PASSES: '',
    },
  },
});

/** integration-tcp, e2e-tcp, integration-pgbouncer, e2e-pgbouncer: each pass's files, env and exclusions. */
function extraPassProjects() {
  return [DatabasePass.DRIVER, DatabasePass.POOLER].flatMap((pass) => {
    const { suffix, env } = EXTRA_PASSES[pass];
    const exclude = [...configDefaults.exclude, ...filesLeftOutOf(pass)];
    return ['integration', 'e2e'].map((name) =>
      tier(`${name}-${suffix}`, [`test/${name}/**/*.test.ts`], {
        globalSetup: DATABASE_SETUP,
        env: { ...DATABASE_ENV, ...env },
        exclude,
        ...SHARED_WORKERS,
      }),
    );
  });
}
