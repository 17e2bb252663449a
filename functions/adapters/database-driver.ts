/**
 * Which PostgreSQL driver opens a connection string (DATABASE_DRIVER, contract v1.2 section 4).
 *
 * - `neon`: `@neondatabase/serverless`'s Pool over a WebSocket to Neon's proxy (locally, to the
 *   WebSocket-to-TCP bridge, infra/local/db-bridge.ts): what the project was first deployed with.
 * - `tcp`: node-postgres (`pg`) over plain TCP, TLS as the URL's `sslmode` asks: any PostgreSQL
 *   that speaks the wire protocol (RDS, Aurora, a self-hosted server, a PgBouncer), Neon included.
 *
 * Unset, the URL's host decides: `neon` for Neon's hosts, `tcp` for every other. Neon serves its
 * databases under `*.neon.tech` (`ep-<name>-<id>[-pooler].<region>.aws.neon.tech`, and
 * `….<region>.azure.neon.tech` in its Azure regions); the Vercel Postgres stores Neon runs for
 * Vercel are `ep-…[-pooler].<region>.postgres.vercel-storage.com`, reached by `@vercel/postgres`
 * through this same Neon driver. A loopback URL therefore defaults to `tcp`: the local bridge is only
 * for a run that asks for `neon` explicitly.
 */
export const DatabaseDriver = {
  NEON: 'neon',
  TCP: 'tcp',
} as const;
export type DatabaseDriver = (typeof DatabaseDriver)[keyof typeof DatabaseDriver];

export const DATABASE_DRIVERS: readonly DatabaseDriver[] = Object.values(DatabaseDriver);

export function isDatabaseDriver(value: string): value is DatabaseDriver {
  return (DATABASE_DRIVERS as readonly string[]).includes(value);
}

/** Host suffixes of the databases Neon serves (a host must end with one, dot included). */
export const NEON_HOST_SUFFIXES = ['.neon.tech', '.postgres.vercel-storage.com'] as const;

/**
 * Whether a host is one of Neon's. A `postgres:` URL's host is opaque to the URL parser, which
 * keeps its case as written (`EP-X.NEON.TECH`) and a trailing dot: both are normalised here.
 */
export function isNeonHost(host: string): boolean {
  const name = host.trim().toLowerCase().replace(/\.$/, '');
  return NEON_HOST_SUFFIXES.some((suffix) => name.endsWith(suffix));
}

/** The driver for `url` when DATABASE_DRIVER is unset: by its host. */
export function defaultDatabaseDriver(url: string): DatabaseDriver {
  let host = '';
  try {
    host = new URL(url).hostname;
  } catch {
    // Not a URL: no Neon host either. The driver reports the unusable URL when it connects.
  }
  return isNeonHost(host) ? DatabaseDriver.NEON : DatabaseDriver.TCP;
}

/** DATABASE_DRIVER if set, else by the URL's host: the one rule every entry point applies. */
export function databaseDriverFor(url: string, configured: DatabaseDriver | undefined): DatabaseDriver {
  return configured ?? defaultDatabaseDriver(url);
}
