import { neonConfig, Pool, type PoolClient } from '@neondatabase/serverless';
import { WebSocket } from 'ws';
import { isCleanupError } from '../cleanup/errors.ts';
import type { Database, Executor } from '../cleanup/executor.ts';
import { redactUrl } from './config.ts';
import { DatabaseAuthenticationError, DatabaseLockTimeoutError, DatabaseUnavailableError } from './errors.ts';

export type { Database, Executor };

/**
 * Database access through the production driver, `@neondatabase/serverless`'s `Pool` over
 * WebSocket. Interactive transactions (advisory locks, `FOR UPDATE`) need it: Neon's HTTP
 * `neon()` function cannot hold a transaction open.
 *
 * Locally no Neon proxy exists, so a WebSocket-to-TCP bridge stands in (`wsProxy`). The local
 * entry points start it and pass its address (infra/local/database.ts); nothing here imports it,
 * so no deployed bundle carries local-only code.
 */

export interface DatabaseOptions {
  url: string;
  /**
   * Reads the connection string again when the database rejects the credentials (SQLSTATE 28P01
   * or 28000: a rotated password). Once per rejection: a changed URL replaces the pool and the
   * work is tried once more; an unchanged one fails with DatabaseAuthenticationError.
   */
  rereadUrl?: () => Promise<string>;
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
  /**
   * Credentials refused. (PgBouncer 1.18 itself reports a failed login as 08P01, measured here:
   * a rotation behind a self-hosted PgBouncer is then retried as a lost connection and picked up
   * at the next cold start. Neon's proxy and PostgreSQL answer 28P01.)
   */
  INVALID_PASSWORD: '28P01',
  INVALID_AUTHORIZATION: '28000',
} as const;

const AUTHENTICATION_SQLSTATES = new Set<string>([SQLSTATE.INVALID_PASSWORD, SQLSTATE.INVALID_AUTHORIZATION]);

const RETRYABLE_SQLSTATES = new Set<string>([
  SQLSTATE.ADMIN_SHUTDOWN,
  SQLSTATE.CRASH_SHUTDOWN,
  SQLSTATE.CANNOT_CONNECT_NOW,
  SQLSTATE.DEADLOCK_DETECTED,
  SQLSTATE.SERIALIZATION_FAILURE,
  SQLSTATE.TOO_MANY_CONNECTIONS,
]);

/** Maps a driver error onto the cleanup's error classes; programming errors pass through. */
export function translateDatabaseError(error: unknown): unknown {
  if (isCleanupError(error)) return error;
  const sqlstate = (error as { code?: unknown })?.code;
  const message = error instanceof Error ? error.message : String(error);
  if (sqlstate === SQLSTATE.LOCK_NOT_AVAILABLE || sqlstate === SQLSTATE.QUERY_CANCELED) {
    return new DatabaseLockTimeoutError(
      `database lock or statement timeout: ${message}`,
      { sqlstate },
      { cause: error },
    );
  }
  if (typeof sqlstate === 'string' && AUTHENTICATION_SQLSTATES.has(sqlstate)) {
    return new DatabaseAuthenticationError(
      `database refused the credentials: ${message}`,
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

export async function openDatabase(options: DatabaseOptions): Promise<Database> {
  configureDriver(options.wsProxy);
  const createPool = (url: string) => {
    const created = new Pool({
      connectionString: url,
      max: options.maxConnections ?? 10,
      // An idle socket is likelier to be dead (frozen Lambda, proxy idle timeout) than reusable.
      idleTimeoutMillis: 30_000,
    });
    // An idle client whose backend is terminated emits 'error' on the pool; unhandled, it would
    // crash the process. The pool discards that client by itself.
    created.on('error', (error: Error) => options.onIdleError?.(error));
    return created;
  };
  let url = options.url;
  let pool = createPool(url);
  /**
   * Pools replaced after a rotation. Not ended then: a pool that is ending never serves the work
   * already queued in it (pg-pool's queue stops), which would leave it waiting forever (seen in
   * database-url-secret.test.ts). They serve their queue (a refused login there retries on the
   * new pool), their idle connections close after idleTimeoutMillis, and end() ends them too.
   */
  const retired: Pool[] = [];
  let rotating: Promise<boolean> | undefined;

  /**
   * After a rejected login: read the URL again (one read for all who were rejected by the same
   * pool) and, if it changed, continue on a new pool.
   */
  const rotate = (rejectedBy: Pool): Promise<boolean> => {
    if (pool !== rejectedBy) return Promise.resolve(true);
    rotating ??= (async () => {
      const next = await options.rereadUrl!();
      if (next === url) return false;
      retired.push(pool);
      url = next;
      pool = createPool(next);
      return true;
    })().finally(() => {
      rotating = undefined;
    });
    return rotating;
  };
  const withCurrentCredentials = async <T>(work: (target: Pool) => Promise<T>): Promise<T> => {
    const used = pool;
    try {
      return await work(used);
    } catch (error) {
      if (!(error instanceof DatabaseAuthenticationError) || !options.rereadUrl) throw error;
      if (!(await rotate(used))) throw error;
      return work(pool);
    }
  };
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
    query: (text, values) => withCurrentCredentials((target) => run(target, text, values)),
    withTransaction: (work) =>
      withCurrentCredentials(async (target) => {
        try {
          return await transactOnce(target, work);
        } catch (error) {
          if (!isLostConnection(error)) throw error;
          return transactOnce(target, work);
        }
      }),
    async end() {
      await Promise.all([...retired, pool].map((each) => each.end()));
    },
  };

  async function transactOnce<T>(target: Pool, work: (tx: Executor) => Promise<T>): Promise<T> {
    let client: PoolClient;
    try {
      client = await target.connect();
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
