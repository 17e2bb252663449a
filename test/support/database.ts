import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import type { DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { TEST_CONNECT_TIMEOUT_MS } from './connect-bound.ts';
import { throughPooler } from './pgbouncer.ts';

export interface TestDatabase {
  url: string;
  name: string;
  /** The driver of the run (DATABASE_DRIVER, else neon): every pool below uses it unless told. */
  driver: DatabaseDriver;
  /** The WebSocket bridge, for the `neon` driver. */
  wsProxy: string;
  db: Database;
  /** Opens another independent pool on the same database (a "different process"). */
  connect(options?: ConnectOptions): Promise<Database>;
  drop(): Promise<void>;
}

interface ConnectOptions {
  lockTimeoutMs?: number;
  maxConnections?: number;
  /** Another driver than the run's, for tests of what differs between them. */
  driver?: DatabaseDriver;
}

/**
 * A fresh database cloned from the migrated template (`empty`: a new database, nothing applied);
 * drop it in `afterAll`. Under
 * DATABASE_POOLER=pgbouncer its `url` and every pool go through the suite's PgBouncer (transaction
 * mode); creating and dropping it stays on the direct connection.
 */
export async function createTestDatabase(creation: { empty?: boolean } = {}): Promise<TestDatabase> {
  const { adminUrl, template, driver, wsProxy, poolerPort } = inject('database');
  // A slow connect (support/connect-bound.ts) must not fail a test about something else.
  const options = {
    driver,
    wsProxy,
    lockTimeoutMs: 5_000,
    statementTimeoutMs: 30_000,
    connectTimeoutMs: TEST_CONNECT_TIMEOUT_MS,
  };
  const admin = await openDatabase({ url: adminUrl, maxConnections: 1, ...options });
  const name = `rc_test_${process.ppid}_${randomBytes(5).toString('hex')}`;
  // CREATE DATABASE takes no parameters; the name is made here from hex digits only.
  await admin.query(
    creation.empty ? `CREATE DATABASE ${name}` : `CREATE DATABASE ${name} TEMPLATE ${template}`,
  );
  const direct = new URL(adminUrl);
  direct.pathname = `/${name}`;
  const url = new URL(poolerPort === null ? direct.toString() : throughPooler(direct.toString(), poolerPort));
  const pools: Database[] = [];
  const connect = async (extra: ConnectOptions = {}) => {
    const db = await openDatabase({ url: url.toString(), ...options, ...extra });
    pools.push(db);
    return db;
  };
  const db = await connect({ maxConnections: 20 });
  return {
    url: url.toString(),
    name,
    driver,
    wsProxy,
    db,
    connect,
    async drop() {
      await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    },
  };
}
