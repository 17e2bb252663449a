import { copyFile, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { type Database, type DatabaseOptions, openDatabase } from '../../functions/adapters/database.ts';
import { DATABASE_DRIVERS, DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import {
  ConfigError,
  DatabaseAuthenticationError,
  DatabaseUnavailableError,
} from '../../functions/adapters/errors.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf } from '../support/probes.ts';
import { startTlsProxy, TEST_CA_FILE, type TlsProxy } from '../support/tls-proxy.ts';

/**
 * What is the tcp driver's own: TLS as the URL's `sslmode` asks (against a real TLS handshake: a
 * TLS front with test certificates before the real PostgreSQL, test/support/tls-proxy.ts), its
 * connection failures mapped onto the error classes the Neon driver's get, and the driver a
 * caller names being the one that connects. (Bounds, lost connections, PgBouncer, passwords and
 * rotation are proven over both drivers in database-survival, pooler, database-no-password and
 * database-url-secret.)
 */
const fixture = useDatabaseFixture();
const BASE = { lockTimeoutMs: 2_000, statementTimeoutMs: 5_000, connectTimeoutMs: 5_000, maxConnections: 2 };
const opened: Database[] = [];

afterAll(async () => {
  await Promise.allSettled(opened.map((db) => db.end()));
});

async function open(options: Partial<DatabaseOptions> & { url: string }): Promise<Database> {
  const db = await openDatabase({ driver: DatabaseDriver.TCP, ...BASE, ...options });
  opened.push(db);
  return db;
}

/** The file's database at another local port (credentials kept: embedded PostgreSQL asks for them). */
function sameDatabaseAt(port: number, query = ''): string {
  const moved = new URL(fixture.t.url);
  moved.hostname = '127.0.0.1';
  moved.port = String(port);
  return `${moved.toString()}${query}`;
}

async function answers(db: Database): Promise<number | undefined> {
  return (await db.query<{ one: number }>('SELECT 1 AS one')).rows[0]?.one;
}

/** Process warnings emitted while `work` runs (pg announces its sslmode semantics as one). */
async function warningsDuring(work: () => Promise<unknown>): Promise<string[]> {
  const seen: string[] = [];
  const listener = (warning: Error) => seen.push(warning.message);
  process.on('warning', listener);
  try {
    await work();
    // process.emitWarning delivers on the next tick.
    await new Promise((resolve) => setImmediate(resolve));
  } finally {
    process.off('warning', listener);
  }
  return seen;
}

describe('the tcp driver over TLS', () => {
  let proxy: TlsProxy;
  let wrongHost: TlsProxy;
  beforeAll(async () => {
    const target = new URL(fixture.t.url);
    const upstream = { host: target.hostname, port: Number(target.port || 5432) };
    proxy = await startTlsProxy({ target: upstream });
    wrongHost = await startTlsProxy({ target: upstream, certificate: 'other-host' });
  });
  afterAll(async () => {
    await proxy?.close();
    await wrongHost?.close();
  });

  it('sslmode=verify-full with the CA as sslrootcert: a verified TLS session, and the database answers', async () => {
    const before = proxy.tlsSessions;
    const db = await open({
      url: sameDatabaseAt(proxy.port, `?sslmode=verify-full&sslrootcert=${TEST_CA_FILE}`),
    });
    expect(await answers(db)).toBe(1);
    expect(proxy.tlsSessions).toBe(before + 1);
  });

  it('sslmode=require verifies the certificate too (pg 8’s meaning, pinned), and says nothing on stderr about it', async () => {
    const trusted = await open({
      url: sameDatabaseAt(proxy.port, `?sslmode=require&sslrootcert=${TEST_CA_FILE}`),
    });
    const warnings = await warningsDuring(async () => expect(await answers(trusted)).toBe(1));
    // pg's eight-line "SECURITY WARNING" about require/prefer/verify-ca, on every cold start.
    expect(warnings.filter((warning) => warning.includes('SSL modes'))).toEqual([]);

    // Without the CA the chain cannot be verified: refused, as a database that is unavailable.
    const untrusted = await open({ url: sameDatabaseAt(proxy.port, '?sslmode=require') });
    const error = await rejectionOf(untrusted.query('SELECT 1'));
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect((error as DatabaseUnavailableError).retryable).toBe(true);
    expect((error as Error).message).toMatch(/^database connection failed: .*certificate/);
  });

  it('refuses a certificate for another host name under verify-full; verify-ca in libpq’s meaning accepts it', async () => {
    const strict = await open({
      url: sameDatabaseAt(wrongHost.port, `?sslmode=verify-full&sslrootcert=${TEST_CA_FILE}`),
    });
    const error = await rejectionOf(strict.query('SELECT 1'));
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect((error as Error).message).toMatch(/does not match certificate's altnames/);

    // uselibpqcompat=true asks pg for libpq's semantics: verify-ca checks the chain, not the name.
    const chainOnly = await open({
      url: sameDatabaseAt(
        wrongHost.port,
        `?uselibpqcompat=true&sslmode=verify-ca&sslrootcert=${TEST_CA_FILE}`,
      ),
    });
    expect(await answers(chainOnly)).toBe(1);
  });

  it('sslmode=no-verify encrypts without checking the certificate', async () => {
    const before = wrongHost.tlsSessions;
    const db = await open({ url: sameDatabaseAt(wrongHost.port, '?sslmode=no-verify') });
    expect(await answers(db)).toBe(1);
    expect(wrongHost.tlsSessions).toBe(before + 1);
  });

  it('sslmode=require against a PostgreSQL without TLS: unavailable, with the server’s answer in the message', async () => {
    const db = await open({
      url: `${fixture.t.url}${fixture.t.url.includes('?') ? '&' : '?'}sslmode=require`,
    });
    const error = await rejectionOf(db.query('SELECT 1'));
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect((error as Error).message).toBe(
      'database connection failed: The server does not support SSL connections',
    );
  });

  it('sslmode=disable against a server that requires TLS: the server’s refusal (28000), as refused credentials', async () => {
    const db = await open({ url: sameDatabaseAt(proxy.port, '?sslmode=disable') });
    const error = await rejectionOf(db.query('SELECT 1'));
    expect(error).toBeInstanceOf(DatabaseAuthenticationError);
    expect((error as DatabaseAuthenticationError).details.sqlstate).toBe('28000');
  });
});

describe('the tcp driver and the files a URL names', () => {
  it('refuses an sslrootcert it cannot read when the pool is made: one line naming DATABASE_URL and the file, no password', async () => {
    const url = `postgres://cleanup:hunter2-secret@127.0.0.1:9/app?sslmode=verify-full&sslrootcert=/nonexistent/rds-ca.pem&sslpassword=key-secret`;
    const error = await rejectionOf(open({ url }));
    expect(error).toBeInstanceOf(ConfigError);
    const message = (error as Error).message;
    expect(message.split('\n')).toHaveLength(1);
    expect(message).toMatch(/^DATABASE_URL=".*" is invalid: cannot be used by the tcp driver: ENOENT/);
    expect(message).toContain('/nonexistent/rds-ca.pem');
    expect(message).not.toContain('hunter2-secret');
    expect(message).not.toContain('key-secret');
  });

  it('a CA file gone after start fails the connect as unavailable, and leaves no timer to crash the process later', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rc-tcp-ca-'));
    onTestFinished(() => rm(dir, { recursive: true, force: true }));
    const ca = join(dir, 'ca.pem');
    await copyFile(TEST_CA_FILE, ca);
    const connectTimeoutMs = 300;
    const db = await open({
      url: sameDatabaseAt(9, `?sslmode=verify-full&sslrootcert=${ca}`),
      connectTimeoutMs,
    });
    await rm(ca);
    const error = await rejectionOf(db.query('SELECT 1'));
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect((error as Error).message).toContain('ENOENT');
    // The connect bound's timer was cleared with the failure: had it fired later, its rejection would
    // have had no listener, which fails this test (and would end a Lambda process).
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    await new Promise((resolve) => setTimeout(resolve, connectTimeoutMs + 200));
    process.off('unhandledRejection', onUnhandled);
    expect(unhandled).toEqual([]);
  });
});

/**
 * How each driver words a refused connect here: the tcp driver gets the socket's own error; the Neon
 * driver locally only sees the bridge close its WebSocket (the bridge does not relay why).
 */
const REFUSED = {
  [DatabaseDriver.TCP]: /^database connection failed: connect ECONNREFUSED 127\.0\.0\.1:9$/,
  [DatabaseDriver.NEON]: /^database connection failed: Connection terminated unexpectedly$/,
} as const;

describe.each(DATABASE_DRIVERS)('over the %s driver: connection failures', (driver) => {
  it('a refused connection is DatabaseUnavailableError, naming the refusal', async () => {
    const db = await open({
      url: 'postgres://postgres@127.0.0.1:9/postgres',
      driver,
      wsProxy: fixture.t.wsProxy,
    });
    const error = await rejectionOf(db.query('SELECT 1'));
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect((error as Error).message).toMatch(REFUSED[driver]);
  });

  it('a host that does not resolve is DatabaseUnavailableError, naming it', async () => {
    // Not loopback: no bridge for it; the Neon driver's WebSocket goes to the host itself.
    const db = await open({ url: 'postgres://postgres@db.does-not-exist.invalid:5432/postgres', driver });
    const error = await rejectionOf(db.query('SELECT 1'));
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect((error as Error).message).toMatch(/db\.does-not-exist\.invalid/);
  });
});

describe('the driver a caller names is the one that connects', () => {
  it('tcp connects straight to PostgreSQL and never uses a WebSocket bridge; neon needs one', async () => {
    const nowhere = '127.0.0.1:9';
    const tcp = await open({ url: fixture.t.url, driver: DatabaseDriver.TCP, wsProxy: nowhere });
    expect(await answers(tcp)).toBe(1);
    const neon = await open({ url: fixture.t.url, driver: DatabaseDriver.NEON, wsProxy: nowhere });
    expect(await rejectionOf(neon.query('SELECT 1'))).toBeInstanceOf(DatabaseUnavailableError);
  });
});
