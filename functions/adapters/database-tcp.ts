import { Client, Pool } from 'pg';
import type { DriverPool, DriverPoolFactory } from './database-pool.ts';
import { ConfigError } from './errors.ts';
import { refuseMissingPassword } from './missing-password.ts';
import { redactConnectionString, redactSecrets } from './redact.ts';

/**
 * The `tcp` driver: node-postgres (`pg`) over TCP, for any PostgreSQL that speaks the wire protocol
 * (RDS, Aurora, a self-hosted server, PgBouncer, Neon too). TLS is what the URL's `sslmode` says.
 */

/** node-postgres's Client with a password that refuses when the URL has none (missing-password.ts). */
class TcpClient extends Client {
  constructor(config?: ConstructorParameters<typeof Client>[0]) {
    super(config);
    refuseMissingPassword(this);
  }
}

/**
 * The sslmodes pg 8 treats as `verify-full` (TLS, the certificate checked against the trusted CAs
 * and the host name), unlike libpq, where they encrypt with less or no checking. pg says so in an
 * eight-line "SECURITY WARNING" on stderr (every cold start, every `npm run ops`), and announces that
 * pg 9 will switch to libpq's weaker meaning. Spelled `verify-full` before pg sees them, the
 * stricter meaning is this project's own, whatever a later pg does, and nothing warns.
 * `uselibpqcompat=true` in the URL still asks pg for libpq's meaning, deliberately.
 */
const VERIFIED_SSLMODES = /([?&]sslmode=)(?:prefer|require|verify-ca)(?=[&#]|$)/g;

/**
 * The connection string as pg is given it: `sslmode=prefer|require|verify-ca` spelled
 * `verify-full`, unless the URL asks for libpq's semantics; everything else byte for byte.
 */
export function tcpConnectionString(url: string): string {
  if (/[?&]uselibpqcompat=true(?=[&#]|$)/.test(url)) return url;
  return url.replace(VERIFIED_SSLMODES, '$1verify-full');
}

/**
 * pg reads the files an URL names (`sslrootcert`, `sslcert`, `sslkey`) each time it creates a
 * client, inside `pool.connect()`, where an unreadable one would throw synchronously. Read once
 * here, when the pool is made, a missing CA bundle is a configuration error that names itself, not
 * an unavailable database retried until the record dead-letters.
 */
function assertUsable(connectionString: string, url: string): void {
  try {
    // Constructing a client parses the URL and reads those files; it opens no socket.
    new Client({ connectionString });
  } catch (error) {
    throw new ConfigError(
      'DATABASE_URL',
      redactConnectionString(url),
      `cannot be used by the tcp driver: ${redactSecrets(String((error as Error)?.message ?? error))}`,
    );
  }
}

export function tcpPoolFactory(): DriverPoolFactory {
  return (settings) => {
    const connectionString = tcpConnectionString(settings.connectionString);
    assertUsable(connectionString, settings.connectionString);
    return new Pool({ ...settings, connectionString, Client: TcpClient }) as unknown as DriverPool;
  };
}
