/**
 * The demo's embedded default for PostgreSQL: the cluster lives in `<dataDir>/postgres` and is
 * kept between runs (initdb takes seconds; a start well under one), and each demo gets a fresh
 * database in it, dropped at the end. So no run ever meets the rows or fences of an earlier
 * one, even after a crash, and the cluster never grows.
 */
import { join } from 'node:path';
import { type Database, openDatabase } from '../../../functions/adapters/database.ts';
import type { DatabaseDriver } from '../../../functions/adapters/database-driver.ts';
import { localConnection } from '../database.ts';
import { startEmbeddedPostgres } from '../embedded-postgres.ts';
import { PostgresInUseError } from '../errors.ts';

export interface DemoDatabase {
  url: string;
  /** Where the data lives, for the header. */
  description: string;
  /** The postmaster's pid, to confirm after `stop` that no PostgreSQL was left running. */
  postmasterPid: number | undefined;
  /** Drops the demo's database and stops the cluster; PostgreSQL is gone when this resolves. */
  stop(): Promise<void>;
}

/** Another demo (or stack) is using the data folder's PostgreSQL right now. */
export class StalePostgresError extends Error {
  readonly code = 'DEMO_STALE_POSTGRES';
  constructor(detail: string) {
    super(`${detail}, or pass another --data-dir`);
  }
}

/** Databases of earlier demos that were not dropped (a killed run): `demo_` + [0-9a-f_]. */
const LEFTOVER_DATABASES = `SELECT datname FROM pg_database WHERE datname ~ '^demo_[0-9a-f_]+$'`;

export async function startDemoDatabase(options: {
  dataDir: string;
  name: string;
  /** DATABASE_DRIVER and DATABASE_WS_PROXY, as configured (either may be unset). */
  configured: { driver: DatabaseDriver | undefined; wsProxy: string | undefined };
}): Promise<DemoDatabase> {
  // CREATE DATABASE takes no parameters: the name is built by the caller from [a-z0-9_] only.
  if (!/^demo_[0-9a-f_]+$/.test(options.name)) throw new Error(`unsafe database name ${options.name}`);
  const clusterDir = join(options.dataDir, 'postgres');
  const cluster = await startEmbeddedPostgres({ dataDir: clusterDir, callerHandlesSignals: true }).catch(
    (error: Error) => {
      throw error instanceof PostgresInUseError ? new StalePostgresError(error.message) : error;
    },
  );
  const postmaster = cluster.postmasterPid;
  const stopCluster = () => cluster.stop();
  let admin: Database | undefined;
  try {
    admin = await openDatabase({
      url: cluster.url,
      ...(await localConnection(cluster.url, options.configured)),
      maxConnections: 1,
      lockTimeoutMs: 5_000,
      statementTimeoutMs: 30_000,
    });
    const leftovers = await admin.query<{ datname: string }>(LEFTOVER_DATABASES);
    for (const { datname } of leftovers.rows) {
      await admin.query(`DROP DATABASE IF EXISTS ${datname} WITH (FORCE)`);
    }
    // Sent once: repeated after a lost answer, it would fail with "already exists".
    await admin.queryOnce(`CREATE DATABASE ${options.name}`);
  } catch (error) {
    await admin?.end().catch(() => {});
    await stopCluster();
    throw error;
  }
  const connected = admin;
  const url = new URL(cluster.url);
  url.pathname = `/${options.name}`;
  let stopped: Promise<void> | undefined;
  return {
    url: url.toString(),
    description: cluster.relocatedFrom
      ? `embedded PostgreSQL in ${cluster.dataDir} (as root, out of ${clusterDir}, which the postgres user cannot enter), database ${options.name}`
      : `embedded PostgreSQL in ${clusterDir}, database ${options.name}`,
    postmasterPid: postmaster,
    stop() {
      stopped ??= (async () => {
        // Best effort: after a Ctrl-C in a terminal PostgreSQL got the SIGINT too (same process
        // group) and may already be shutting down; the next start drops what is left.
        await connected.query(`DROP DATABASE IF EXISTS ${options.name} WITH (FORCE)`).catch(() => {});
        await connected.end().catch(() => {});
        await stopCluster();
      })();
      return stopped;
    },
  };
}
