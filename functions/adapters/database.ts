import { neonConfig, Pool, type PoolClient } from '@neondatabase/serverless';
import { WebSocket } from 'ws';
import { isCleanupError } from '../cleanup/errors.ts';
import type { Database, Executor } from '../cleanup/executor.ts';
import { redactUrl } from './config.ts';
import { DatabaseLockTimeoutError, DatabaseUnavailableError } from './errors.ts';

export type { Database, Executor };

/**
 * Database access through the production driver, `@neondatabase/serverless`'s `Pool` over
 * WebSocket. Interactive transactions (advisory locks, `FOR UPDATE`) need it: Neon's HTTP
 * `neon()` function cannot hold a transaction open.
 *
 * Locally no Neon proxy exists, so a WebSocket-to-TCP bridge (`infra/local/db-bridge.ts`)
 * stands in: `DATABASE_WS_PROXY=127.0.0.1:<port>`, or, for a loopback `DATABASE_URL` with no
 * proxy configured, one started in-process on first use.
 */

export interface DatabaseOptions {
  url: string;
  /** `host:port` of a local WebSocket bridge; omitted in deployment (Neon's own proxy). */
  wsProxy?: string;
  maxConnections?: number;
  lockTimeoutMs: number;
  statementTimeoutMs: number;
  /** Called for errors on idle connections (e.g. a backend terminated while parked in the pool). */
  onIdleError?: (error: Error) => void;
}

/**
 * PostgreSQL SQLSTATEs that change what the cleanup does. Everything in class 08 (connection
 * exception) is treated like ADMIN_SHUTDOWN: the work is retried on a fresh connection.
 */
export const SQLSTATE = {
  LOCK_NOT_AVAILABLE: '55P03',
  QUERY_CANCELED: '57014',
  ADMIN_SHUTDOWN: '57P01',
  CRASH_SHUTDOWN: '57P02',
  CANNOT_CONNECT_NOW: '57P03',
  DEADLOCK_DETECTED: '40P01',
  SERIALIZATION_FAILURE: '40001',
  TOO_MANY_CONNECTIONS: '53300',
} as const;

const RETRYABLE_SQLSTATES = new Set<string>([
  SQLSTATE.ADMIN_SHUTDOWN,
  SQLSTATE.CRASH_SHUTDOWN,
  SQLSTATE.CANNOT_CONNECT_NOW,
  SQLSTATE.DEADLOCK_DETECTED,
  SQLSTATE.SERIALIZATION_FAILURE,
  SQLSTATE.TOO_MANY_CONNECTIONS,
]);

/**
 * The driver rejects with the WebSocket's ErrorEvent when the connection itself fails (a host
 * that does not resolve, a refused port): it carries a message but is no Error, and String() of
 * it printed "[object Object]" where "getaddrinfo ENOTFOUND <host>" belonged.
 */
function messageOf(error: unknown): string {
  if (error instanceof Error) return error.message;
  const message = (error as { message?: unknown } | null)?.message;
  return typeof message === 'string' && message !== '' ? message : String(error);
}

/** Maps a driver error onto the cleanup's error classes; programming errors pass through. */
export function translateDatabaseError(error: unknown): unknown {
  if (isCleanupError(error)) return error;
  const sqlstate = (error as { code?: unknown })?.code;
  const message = messageOf(error);
  if (sqlstate === SQLSTATE.LOCK_NOT_AVAILABLE || sqlstate === SQLSTATE.QUERY_CANCELED) {
    return new DatabaseLockTimeoutError(
      `database lock or statement timeout: ${message}`,
      { sqlstate },
      { cause: error },
    );
  }
  if (typeof sqlstate === 'string' && (RETRYABLE_SQLSTATES.has(sqlstate) || sqlstate.startsWith('08'))) {
    return new DatabaseUnavailableError(`database unavailable: ${message}`, { sqlstate }, { cause: error });
  }
  if (typeof sqlstate !== 'string' || !/^[0-9A-Z]{5}$/.test(sqlstate)) {
    // No SQLSTATE: a socket, WebSocket or pool error. The connection is gone, the work is not.
    return new DatabaseUnavailableError(`database connection failed: ${message}`, {}, { cause: error });
  }
  return error;
}

let inProcessBridge: Promise<{ address: string; close(): Promise<void> }> | undefined;

function isLoopbackUrl(url: string): boolean {
  const host = new URL(url).hostname.replace(/^\[|\]$/g, '');
  return host === 'localhost' || host === '::1' || /^127(\.\d{1,3}){3}$/.test(host);
}

/** Points the Neon driver at a local bridge for loopback hosts; other hosts keep Neon's proxy. */
function configureDriver(wsProxy: string | undefined): void {
  neonConfig.webSocketConstructor = WebSocket as unknown as typeof neonConfig.webSocketConstructor;
  if (!wsProxy) return;
  neonConfig.wsProxy = (host, port) =>
    /^(127\.|localhost$|::1$|\[::1\]$)/.test(host) ? `${wsProxy}/v1?address=${host}:${port}` : `${host}/v2`;
  neonConfig.useSecureWebSocket = false;
  neonConfig.pipelineTLS = false;
  // The default ('password') fails against trust and SCRAM auth on a plain PostgreSQL.
  neonConfig.pipelineConnect = false;
  // Coalescing costs about 1.3 ms per query on loopback, where there is no network to save.
  neonConfig.coalesceWrites = false;
}

async function resolveWsProxy(options: DatabaseOptions): Promise<string | undefined> {
  const configured = options.wsProxy ?? process.env.DATABASE_WS_PROXY;
  if (configured) return configured;
  if (!isLoopbackUrl(options.url)) return undefined;
  inProcessBridge ??= import('../../infra/local/db-bridge.ts').then((module) => module.startDatabaseBridge());
  return (await inProcessBridge).address;
}

/** Closes the bridge started on demand for a loopback URL, if any (CLIs call this before exit). */
export async function closeInProcessBridge(): Promise<void> {
  const bridge = inProcessBridge;
  inProcessBridge = undefined;
  if (bridge) await (await bridge).close();
}

export async function openDatabase(options: DatabaseOptions): Promise<Database> {
  configureDriver(await resolveWsProxy(options));
  const pool = new Pool({
    connectionString: options.url,
    max: options.maxConnections ?? 10,
    // An idle socket is likelier to be dead (frozen Lambda, proxy idle timeout) than reusable.
    idleTimeoutMillis: 30_000,
  });
  // An idle client whose backend is terminated emits 'error' on the pool; unhandled, it would
  // crash the process. The pool discards that client by itself.
  pool.on('error', (error: Error) => options.onIdleError?.(error));
  const lockTimeoutMs = Math.trunc(options.lockTimeoutMs);
  const statementTimeoutMs = Math.trunc(options.statementTimeoutMs);
  // Built once from validated integers (never from message text): one round trip opens the
  // transaction and bounds it, and SET LOCAL also works behind a transaction-mode pooler.
  const beginStatement = `BEGIN; SET LOCAL lock_timeout = ${lockTimeoutMs}; SET LOCAL statement_timeout = ${statementTimeoutMs}`;
  const stats = { queries: 0, transactions: 0 };

  const run = async <Row>(target: Pool | PoolClient, text: string, values?: readonly unknown[]) => {
    stats.queries += 1;
    try {
      const result = await target.query(text, values as unknown[] | undefined);
      return { rows: result.rows as Row[], rowCount: result.rowCount ?? 0 };
    } catch (error) {
      throw translateDatabaseError(error);
    }
  };

  return {
    stats,
    query: (text, values) => run(pool, text, values),
    async withTransaction(work) {
      try {
        return await transactOnce(work);
      } catch (error) {
        if (!isLostConnection(error)) throw error;
        return transactOnce(work);
      }
    },
    async end() {
      await pool.end();
    },
  };

  async function transactOnce<T>(work: (tx: Executor) => Promise<T>): Promise<T> {
    let client: PoolClient;
    try {
      client = await pool.connect();
    } catch (error) {
      throw translateDatabaseError(error);
    }
    stats.transactions += 1;
    let broken: Error | undefined;
    // The pool stops listening for 'error' on a client it hands out. A connection lost while the
    // client sits between two statements (backend terminated, proxy restarted) is then emitted as
    // an 'error' nobody hears, which crashes the process (found by the chaos suite). Heard here, it
    // only fails the next statement, and the transaction is retried as a lost connection.
    const onClientError = (error: Error) => {
      broken ??= error;
    };
    client.on('error', onClientError);
    try {
      await run(client, beginStatement);
      const result = await work({ query: (text, values) => run(client, text, values) });
      await run(client, 'COMMIT');
      return result;
    } catch (error) {
      try {
        await client.query('ROLLBACK');
      } catch (rollbackError) {
        broken = rollbackError as Error;
      }
      throw error;
    } finally {
      client.removeListener('error', onClientError);
      client.release(broken);
    }
  }
}

/** A connection-level failure (no SQLSTATE from the server, or the backend was terminated). */
function isLostConnection(error: unknown): boolean {
  if (!(error instanceof DatabaseUnavailableError)) return false;
  const sqlstate = error.details.sqlstate;
  return sqlstate === undefined || sqlstate === SQLSTATE.ADMIN_SHUTDOWN || String(sqlstate).startsWith('08');
}

/** For messages and logs: the URL with its password hidden. */
export function describeDatabase(url: string): string {
  return redactUrl(url);
}
