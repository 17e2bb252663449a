import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { type Database, openDatabase, type PooledDatabase } from '../../functions/adapters/database.ts';
import type { DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { TEST_CONNECT_TIMEOUT_MS } from './connect-bound.ts';
import { reconnectServers, throughPooler } from './pgbouncer.ts';

export interface TestDatabase {
  url: string;
  name: string;
  /** The driver of the run (DATABASE_DRIVER, else neon): every pool below uses it unless told. */
  driver: DatabaseDriver;
  /** The WebSocket bridge, for the `neon` driver. */
  wsProxy: string;
  /** The tests' pool; replaced by setDefaultIsolation, so read it where it is used. */
  db: Database;
  /** Opens another independent pool on the same database (a "different process"). */
  connect(options?: ConnectOptions): Promise<PooledDatabase>;
  /**
   * ALTER DATABASE ... SET (a level) or RESET (null) default_transaction_isolation, seen by every
   * transaction after it, pooled ones included (their server connections log in again).
   */
  setDefaultIsolation(level: 'repeatable read' | 'serializable' | null): Promise<void>;
  /** The same for DateStyle: how the database renders timestamps as text, unless a session says. */
  setDateStyle(style: 'SQL, DMY' | 'German' | 'Postgres, DMY' | null): Promise<void>;
  drop(): Promise<void>;
}

interface ConnectOptions {
  lockTimeoutMs?: number;
  maxConnections?: number;
  /** Another driver than the run's, for tests of what differs between them. */
  driver?: DatabaseDriver;
  /**
   * On the server itself even under DATABASE_POOLER=pgbouncer: for tests of session state (a
   * `SET SESSION`, an `ALTER DATABASE ... SET` read at login) that a transaction pooler would hand
   * to other tests' transactions, or hide behind server connections opened before it.
   */
  direct?: boolean;
  /** The pool's `application_name`: the name a chaos fault or probe picks its backends by. */
  applicationName?: string;
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
  const connect = async ({ direct: onTheServer, applicationName, ...extra }: ConnectOptions = {}) => {
    const target = new URL(onTheServer ? direct : url);
    if (applicationName !== undefined) target.searchParams.set('application_name', applicationName);
    const db = await openDatabase({ url: target.toString(), ...options, ...extra });
    pools.push(db);
    return db;
  };
  /** ALTER DATABASE ... SET or RESET one setting, seen by every session that logs in after it. */
  const setDefault = async (setting: string, value: string | null) => {
    // The name is made of hex digits above; the setting and its value are literals of the callers.
    await admin.query(
      value === null
        ? `ALTER DATABASE ${name} RESET ${setting}`
        : `ALTER DATABASE ${name} SET ${setting} = '${value}'`,
    );
    // A login-time setting reaches only sessions that log in after it: the sessions already
    // open (in `db`'s pool, or PgBouncer's) would carry the old default into the next test.
    // Behind PgBouncer its servers log in again as they are released; `db` is replaced by a
    // new pool (the tests' own pools from connect() are theirs to end).
    if (poolerPort !== null) await reconnectServers(adminUrl, poolerPort, name);
    const previous = database.db;
    database.db = await connect({ maxConnections: 20 });
    await previous.end();
  };
  const database: TestDatabase = {
    url: url.toString(),
    name,
    driver,
    wsProxy,
    db: await connect({ maxConnections: 20 }),
    connect,
    setDefaultIsolation: (level) => setDefault('default_transaction_isolation', level),
    setDateStyle: (style) => setDefault('DateStyle', style),
    async drop() {
      await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    },
  };
  return database;
}
