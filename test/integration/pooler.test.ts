import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it, onTestFinished } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { DATABASE_DRIVERS, type DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { migrate } from '../../infra/migrate.ts';
import { createTestDatabase } from '../support/database.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { throughPooler } from '../support/pgbouncer.ts';

/**
 * Neon's pooled endpoint is PgBouncer in transaction mode: each transaction (or autocommit
 * statement) may run on another server connection, so session state does not survive between
 * them. The suites run once more with DATABASE_POOLER=pgbouncer (`npm run test:pgbouncer`, CI),
 * every test database reached through a real PgBouncer; this file checks that they really are,
 * and the properties the protocol leans on, in whichever mode it runs, over both drivers.
 */
const fixture = useDatabaseFixture();
const LOCK_TIMEOUT_MS = 1_234;
const { adminUrl, driver: runDriver, wsProxy, poolerPort } = inject('database');

let admin: Database;
beforeAll(async () => {
  admin = await openDatabase({
    url: adminUrl,
    driver: runDriver,
    wsProxy,
    lockTimeoutMs: 5_000,
    statementTimeoutMs: 60_000,
  });
});
afterAll(async () => {
  await admin?.end();
});

function connect(driver: DatabaseDriver, url: string, maxConnections = 2): Promise<Database> {
  return openDatabase({
    url,
    driver,
    wsProxy,
    maxConnections,
    lockTimeoutMs: LOCK_TIMEOUT_MS,
    statementTimeoutMs: 30_000,
  });
}

it("is the path and driver this project's environment names (a pass merged into one run must not run direct)", () => {
  expect(poolerPort !== null).toBe(process.env.DATABASE_POOLER === 'pgbouncer');
  expect(runDriver).toBe(process.env.DATABASE_DRIVER);
});

describe.each(DATABASE_DRIVERS)('over the %s driver', (driver) => {
  describe('the path to the database', () => {
    it('is the one DATABASE_POOLER asks for: through PgBouncer in transaction mode, or direct', async () => {
      const { rows } = await fixture.t.db.query<{ port: number }>(
        `SELECT current_setting('port')::int AS port`,
      );
      const serverPort = rows[0]!.port;
      const urlPort = Number(new URL(fixture.t.url).port || 5432);
      if (poolerPort === null) {
        expect(urlPort).toBe(serverPort);
        return;
      }
      expect(urlPort).toBe(poolerPort);
      expect(urlPort).not.toBe(serverPort);
      // PgBouncer's own console: the test database has a pool, and it is a transaction pool.
      const consoleUrl = new URL(fixture.t.url);
      consoleUrl.pathname = '/pgbouncer';
      const pgbouncer = await connect(driver, consoleUrl.toString(), 1);
      try {
        const config = await pgbouncer.query<{ key: string; value: string }>('SHOW CONFIG');
        expect(config.rows.find((row) => row.key === 'pool_mode')?.value).toBe('transaction');
        const pools = await pgbouncer.query<{ database: string; pool_mode: string }>('SHOW POOLS');
        expect(pools.rows.find((row) => row.database === fixture.t.name)?.pool_mode).toBe('transaction');
      } finally {
        await pgbouncer.end();
      }
    });
  });

  describe('session state', () => {
    it('does not survive between statements behind the pooler (so a session SET in the code would fail this run)', async () => {
      // A database of its own: behind the pooler the SET stays on a server connection that other
      // clients of the same database get next (seen happen here), so it must not share one.
      const own = await createTestDatabase();
      onTestFinished(() => own.drop());
      const client = await connect(driver, own.url, 1);
      const other = await connect(driver, own.url, 1);
      const setting = `SELECT setting FROM pg_settings WHERE name = 'lock_timeout'`;
      try {
        await client.query(`SET lock_timeout = '4321ms'`);
        // Another client takes the server connection that just ran the SET and keeps it in a
        // transaction: PgBouncer hands idle server connections out last-in first-out.
        let release: () => void = () => {};
        const gate = new Promise<void>((resolve) => {
          release = resolve;
        });
        let started: () => void = () => {};
        const isStarted = new Promise<void>((resolve) => {
          started = resolve;
        });
        const holding = other.withTransaction(async (tx) => {
          await tx.query('SELECT 1');
          started();
          await gate;
        });
        await isStarted;
        const seen = (await client.query<{ setting: string }>(setting)).rows[0]?.setting;
        release();
        await holding;
        // Directly, the session keeps its SET; through the pooler the next statement ran elsewhere.
        expect(seen).toBe(poolerPort === null ? '4321' : '0');
      } finally {
        await client.end();
        await other.end();
      }
    });
  });

  describe('what the protocol leans on, behind a transaction pooler', () => {
    it('bounds each transaction with SET LOCAL, which never outlives it', async () => {
      const db = await connect(driver, fixture.t.url);
      try {
        const setting = `SELECT setting FROM pg_settings WHERE name = 'lock_timeout'`;
        const inside = await db.withTransaction(
          async (tx) => (await tx.query<{ setting: string }>(setting)).rows[0],
        );
        expect(inside?.setting).toBe(String(LOCK_TIMEOUT_MS));
        for (let i = 0; i < 4; i += 1) {
          // Plain statements on whatever server connection comes next: the default, not the last SET LOCAL.
          expect((await db.query<{ setting: string }>(setting)).rows[0]?.setting).toBe('0');
        }
      } finally {
        await db.end();
      }
    });

    it('holds a transaction-scoped advisory lock for exactly its transaction, seen from another connection', async () => {
      const key = BigInt.asIntN(64, BigInt(`0x${randomBytes(8).toString('hex')}`)).toString();
      const holder = await connect(driver, fixture.t.url);
      const prober = await connect(driver, fixture.t.url);
      const tryLock = async () =>
        (
          await prober.withTransaction((tx) =>
            tx.query<{ got: boolean }>('SELECT pg_try_advisory_xact_lock($1::bigint) AS got', [key]),
          )
        ).rows[0]?.got;
      try {
        let release: () => void = () => {};
        const gate = new Promise<void>((resolve) => {
          release = resolve;
        });
        let locked: () => void = () => {};
        const isLocked = new Promise<void>((resolve) => {
          locked = resolve;
        });
        const holding = holder.withTransaction(async (tx) => {
          await tx.query('SELECT pg_advisory_xact_lock($1::bigint)', [key]);
          locked();
          await gate;
        });
        await isLocked;
        expect(await tryLock()).toBe(false);
        release();
        await holding;
        expect(await tryLock()).toBe(true);
      } finally {
        await holder.end();
        await prober.end();
      }
    });

    it('applies the migrations through the same path: one transaction, a transaction-scoped lock, no session state', async () => {
      const name = `rc_test_${process.ppid}_${randomBytes(5).toString('hex')}`;
      await admin.query(`CREATE DATABASE ${name}`);
      const direct = new URL(adminUrl);
      direct.pathname = `/${name}`;
      const url = poolerPort === null ? direct.toString() : throughPooler(direct.toString(), poolerPort);
      const db = await connect(driver, url);
      try {
        const applied = await migrate(db);
        expect(applied.length).toBeGreaterThan(0);
        expect(await migrate(db)).toEqual([]);
        const { rows } = await db.query<{ blocked: boolean }>(
          `SELECT runtime_cleanup_blocked('u', 's') AS blocked`,
        );
        expect(rows[0]?.blocked).toBe(false);
      } finally {
        await db.end();
        await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      }
    });
  });
});
