/**
 * What the second and third database passes of CI run (`npm run test:tcp`, `npm run test:pgbouncer`):
 * the integration and e2e tiers once more over another database path, minus the files whose
 * outcome cannot depend on it. Running those again proves nothing new and cost about a minute and
 * a half of each pass on two cores, so they run once, in `npm test`.
 *
 * DRIVER_FREE_FILES holds a file only if it never opens the test database: the harness test
 * test/harness/driver-passes.test.ts fails if a listed file calls one of the database entry points
 * of test/support (createTestDatabase, the database, provisioner and stack fixtures,
 * startTestStack, inject('database')), except where `childrenOnly` says why. OWN_DRIVER_FILES
 * holds the files that pick each test's driver themselves. A file that is not listed runs in every
 * pass: forgetting to list one costs time, never coverage.
 */

export interface DriverFreeFile {
  /** Why the database path cannot change what the file proves. */
  reason: string;
  /**
   * It hands the test database to child processes whose subject is not the database (their exit
   * status): the one use of a database entry point a listed file may make.
   */
  childrenOnly?: boolean;
}

const PROVISIONER_ONLY = 'the provisioner client and the local provisioner over HTTP; no database';

export const DRIVER_FREE_FILES: Readonly<Record<string, DriverFreeFile>> = {
  'test/integration/template-local.test.ts': {
    reason: 'the packaged local stage; nothing runs against a database',
  },
  'test/integration/template-stage-settings.test.ts': {
    reason: "package-time validation of a stage's settings; nothing runs",
  },
  'test/integration/template.test.ts': {
    reason:
      'the packaged template and zips, read; the bundles only imported (packaged-bundles.test.ts runs them)',
  },
  'test/integration/template-production.test.ts': {
    reason: 'the production stage’s template and zips, read (packaged-bundles.test.ts runs the bundles)',
  },
  'test/integration/provisioner-answer-origin.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-audit-control.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-body-limit.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-chaos-modes.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-client-signals.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-client.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-delete-may-still-act.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-faults.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-lifecycle.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-listing.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-reply-faults.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-token.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/provisioner-verification.test.ts': { reason: PROVISIONER_ONLY },
  'test/integration/event-source.test.ts': {
    reason: 'the emulated event source mapping over the SQS emulator',
  },
  'test/integration/event-source-timeout.test.ts': {
    reason: 'the emulated event source mapping over the SQS emulator',
  },
  'test/integration/aws-timeouts.test.ts': { reason: 'SQS and SSM endpoints that never answer; no database' },
  'test/e2e/cli-usage.test.ts': { reason: 'usage errors, and a database URL where nothing listens' },
  'test/e2e/secrets-in-output.test.ts': { reason: 'redaction of URLs that reach no database' },
  'test/e2e/package-scripts.test.ts': { reason: "the package scripts' wiring, each asked for --help" },
  'test/e2e/test-scripts-exit-status.test.ts': {
    reason: "the test scripts' exit status on fixtures of one assertion each",
    childrenOnly: true,
  },
};

/**
 * Files that choose the driver of each of their database tests themselves: every top-level block is
 * `describe.each(DATABASE_DRIVERS)`, or names the one driver it is about ("the tcp driver …"), or
 * is listed in `blocks` with why the suite's driver cannot reach it, and nothing in them reads the
 * pass's own driver or path. The tcp pass changes nothing but the suite's default driver, so it
 * would run each of their tests once more over the same driver; it leaves them out. The pooler
 * pass runs them unless `ownServer`: their tests reach a PostgreSQL they start themselves (or the
 * machine's, by DATABASE_URL), never the suite's database nor its PgBouncer.
 * test/harness/driver-passes.test.ts checks the blocks, and that an `ownServer` file opens no
 * test database and never reads where it or its pooler is.
 */
export interface OwnDriverFile {
  reason: string;
  /** Top-level blocks that neither iterate over the drivers nor name one, each with why. */
  blocks?: Readonly<Record<string, string>>;
  ownServer?: boolean;
}

export const OWN_DRIVER_FILES: Readonly<Record<string, OwnDriverFile>> = {
  'test/integration/database-survival.test.ts': {
    reason: 'terminated backends, silent connects and statements: each test over the driver it names',
  },
  'test/integration/database-tcp.test.ts': {
    reason: 'the tcp driver’s TLS and URL files, and connection failures over each driver',
    blocks: {
      'the driver a caller names is the one that connects':
        'its one test opens the suite’s URL over tcp and over neon, each named, with a bridge that is not there',
    },
  },
  'test/integration/database-no-password.test.ts': {
    reason: 'a URL without a password against its own SCRAM server, over each driver',
    ownServer: true,
  },
  'test/integration/database-url-secret.test.ts': {
    reason: 'the URL from SSM against its own SCRAM server, over each driver',
    ownServer: true,
    blocks: {
      'the local commands':
        'refused before any connect, its one command given DATABASE_DRIVER=neon and a bridge that is not there',
    },
  },
};

/**
 * The packaged bundles run against the test database over both drivers (the default pass and the
 * tcp pass); behind the pooler they would prove only the handlers' database path, which the
 * handlers' own tests prove there.
 */
export const POOLER_PASS_ALSO_LEAVES_OUT: Readonly<Record<string, string>> = {
  'test/integration/packaged-bundles.test.ts':
    'the packaged bundles: proven over both drivers without a pooler',
};

export const DatabasePass = { DRIVER: 'driver', POOLER: 'pooler' } as const;
export type DatabasePass = (typeof DatabasePass)[keyof typeof DatabasePass];

/** RUNTIME_CLEANUP_TEST_PASS as the test scripts set it; unset for `npm test`, which runs every file. */
export function databasePass(
  env: Readonly<Record<string, string | undefined>> = process.env,
): DatabasePass | null {
  const value = env.RUNTIME_CLEANUP_TEST_PASS?.trim();
  if (!value) return null;
  if (value === DatabasePass.DRIVER || value === DatabasePass.POOLER) return value;
  throw new Error(`RUNTIME_CLEANUP_TEST_PASS="${value}" is invalid: must be "driver", "pooler" or unset`);
}

/** The files a pass leaves out (paths relative to the repository, as Vitest's `exclude` takes them). */
export function filesLeftOutOf(pass: DatabasePass | null): string[] {
  if (pass === null) return [];
  const driverFree = Object.keys(DRIVER_FREE_FILES);
  const ownDriver = Object.entries(OWN_DRIVER_FILES);
  return pass === DatabasePass.POOLER
    ? [
        ...driverFree,
        ...ownDriver.filter(([, file]) => file.ownServer === true).map(([path]) => path),
        ...Object.keys(POOLER_PASS_ALSO_LEAVES_OUT),
      ]
    : [...driverFree, ...ownDriver.map(([path]) => path)];
}

/**
 * RUNTIME_CLEANUP_TEST_PASSES=all (what `.ci/run` sets for `npm test`): one Vitest run holds the
 * default pass, the tcp pass and the PgBouncer pass, the latter two as projects of their own
 * (integration-tcp, e2e-pgbouncer, …), so that one pass's waits (visibility timeouts, backoffs,
 * child processes starting) overlap another's work instead of adding up pass after pass. Unset,
 * `npm test` is the default pass alone, and `npm run test:tcp` / `test:pgbouncer` run one pass each.
 */
export function allPassesRequested(env: Readonly<Record<string, string | undefined>> = process.env): boolean {
  const value = env.RUNTIME_CLEANUP_TEST_PASSES?.trim();
  if (!value) return false;
  if (value === 'all') return true;
  throw new Error(`RUNTIME_CLEANUP_TEST_PASSES="${value}" is invalid: must be "all" or unset`);
}

/** A pass's projects: their name suffix and what their workers' environment adds. */
export const EXTRA_PASSES: Readonly<Record<DatabasePass, { suffix: string; env: Record<string, string> }>> = {
  [DatabasePass.DRIVER]: { suffix: 'tcp', env: { DATABASE_DRIVER: 'tcp' } },
  [DatabasePass.POOLER]: { suffix: 'pgbouncer', env: { DATABASE_POOLER: 'pgbouncer' } },
};
