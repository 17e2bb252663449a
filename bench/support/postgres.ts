/**
 * The benchmark's PostgreSQL: DATABASE_URL when set, else an embedded PostgreSQL in a temporary
 * directory (removed at the end). Every pool goes through the production driver and the local
 * WebSocket bridge (`openDatabase`), as the functions do. Each scenario gets a fresh, migrated
 * database so no run sees another's rows, dead tuples or statistics.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { PooledDatabase } from '../../functions/adapters/database.ts';
import { startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { migrate } from '../../infra/migrate.ts';
import { startChild } from './child-process.ts';
import { installLockTakenNote } from './instrumented-functions.ts';
import { openBenchPool } from './pools.ts';

export interface BenchPostgres {
  readonly source: 'DATABASE_URL' | 'embedded-postgres';
  /** `SELECT version()`, for the machine description. */
  readonly version: string;
  readonly wsProxy: string;
  /** The bridge's process, for the CPU report. */
  readonly bridgePid: number;
  createDatabase(label: string): Promise<BenchDatabase>;
  stop(): Promise<void>;
}

export interface BenchDatabase {
  readonly url: string;
  readonly name: string;
  /** Opens an independent pool (one per simulated process: cleanups, lease renewals, recovery). */
  open(options: { maxConnections: number }): Promise<PooledDatabase>;
  drop(): Promise<void>;
}

export async function startBenchPostgres(): Promise<BenchPostgres> {
  const cleanups: Array<() => Promise<void>> = [];
  const stop = async () => {
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
    cleanups.length = 0;
  };
  try {
    let adminUrl = process.env.DATABASE_URL;
    const source = adminUrl ? 'DATABASE_URL' : 'embedded-postgres';
    if (!adminUrl) {
      const dataDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-bench-pg-'));
      cleanups.push(() => rm(dataDir, { recursive: true, force: true }));
      const embedded = await startEmbeddedPostgres({ dataDir, persistent: false });
      cleanups.push(() => embedded.stop());
      adminUrl = embedded.url;
    }
    const bridge = await startChild<{ address: string }>(new URL('./bridge-process.ts', import.meta.url));
    cleanups.push(() => bridge.stop());
    const open = (url: string, maxConnections: number) =>
      openBenchPool({ url, wsProxy: bridge.ready.address, maxConnections });
    const admin = await open(adminUrl, 1);
    cleanups.push(() => admin.end());
    const { rows } = await admin.query<{ version: string }>('SELECT version() AS version');
    const databaseUrl = adminUrl;

    return {
      source,
      version: rows[0]!.version,
      wsProxy: bridge.ready.address,
      bridgePid: bridge.pid,
      async createDatabase(label) {
        // CREATE DATABASE takes no parameters; the name is built here from [a-z0-9_] only.
        const name = `rc_bench_${label.replace(/[^a-z0-9]/g, '_')}_${randomBytes(4).toString('hex')}`;
        await admin.query(`CREATE DATABASE ${name}`);
        const url = new URL(databaseUrl);
        url.pathname = `/${name}`;
        const pools: PooledDatabase[] = [];
        const openPool = async ({ maxConnections }: { maxConnections: number }) => {
          const pool = await open(url.toString(), maxConnections);
          pools.push(pool);
          return pool;
        };
        const migrator = await openPool({ maxConnections: 1 });
        await migrate(migrator);
        // The server-side lock-hold clock, in this benchmark database only.
        await installLockTakenNote(migrator);
        return {
          url: url.toString(),
          name,
          open: openPool,
          async drop() {
            await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
            await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
          },
        };
      },
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
