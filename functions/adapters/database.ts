import { isCleanupError } from '../cleanup/errors.ts';
import type { Database, Executor, TransactOptions } from '../cleanup/executor.ts';
import { CONFIG_DEFAULTS, redactUrl } from './config.ts';
import { DatabaseDriver, databaseDriverFor } from './database-driver.ts';
import { neonPoolFactory } from './database-neon.ts';
import type { DriverClient, DriverPool, DriverPoolFactory } from './database-pool.ts';
import { tcpPoolFactory } from './database-tcp.ts';
import { DatabaseAuthenticationError, DatabaseLockTimeoutError, DatabaseUnavailableError } from './errors.ts';
import { inlineParameters } from './sql-literal.ts';

export type { Database, Executor };
export { DatabaseDriver };

/** One statement's result within a message of several. */
export interface StatementResult {
  rows: unknown[];
  rowCount: number;
}

/**
 * The `Database` port as `openDatabase` implements it, with the one-message transaction its
 * `transact` is built on, for a caller that composes the message itself.
 */
export interface PooledDatabase extends Database {
  /**
   * A whole transaction in ONE simple-query message on one pooled connection, every statement's
   * result in order. `compose` gets the statement that opens every transaction here (BEGIN
   * ISOLATION LEVEL READ COMMITTED and the SET LOCAL bounds: beginTransactionStatement) and returns
   * the message, which must end the transaction itself (COMMIT). It runs once the connection is in
   * hand, right before the message is sent (so a wait for a pool slot precedes it), and again if
   * the message is sent once more. Handled as `transact` is, which is this with one statement: the
   * client-side bounds, a failed transaction rolled back, a broken connection discarded, once more
   * on a fresh connection after a lost one (so the message must be safe to repeat). The simple-query
   * protocol takes no parameters: a caller inlines its values with sql-literal.ts, as `transact` does.
   */
  transactInOneMessage(compose: (begin: string) => string): Promise<StatementResult[]>;
}

/**
 * The `Database` port (cleanup/executor.ts) over either driver (database-driver.ts): Neon's
 * serverless driver over WebSocket (database-neon.ts) or node-postgres over TCP (database-tcp.ts).
 * Both are pg-pool underneath, so everything here is written once against that interface
 * (database-pool.ts): the client-side bounds, the one-round-trip transaction, the retry on a lost
 * connection, broken connections kept out of the pool, and the credential re-read on a refused login.
 */

export interface DatabaseOptions {
  url: string;
  /**
   * DATABASE_DRIVER: `neon` or `tcp`. Unset, the URL's host decides (`neon` for Neon's hosts, `tcp`
   * otherwise: database-driver.ts), per pool, so a rotated URL is opened the way its host needs.
   */
  driver?: DatabaseDriver;
  /**
   * Reads the connection string again when the database rejects the credentials (SQLSTATE 28P01
   * or 28000: a rotated password). Once per rejection: a changed URL replaces the pool and the
   * work is tried once more; an unchanged one fails with DatabaseAuthenticationError.
   */
  rereadUrl?: () => Promise<string>;
  /**
   * `host:port` of a local WebSocket bridge for the `neon` driver; omitted in deployment (Neon's own
   * proxy). The `tcp` driver ignores it.
   */
  wsProxy?: string;
  maxConnections?: number;
  lockTimeoutMs: number;
  statementTimeoutMs: number;
  /**
   * Bounds getting a connection: the wait for a free pool slot, the WebSocket, startup and
   * authentication (DATABASE_CONNECT_TIMEOUT_MS by default).
   */
  connectTimeoutMs?: number;
  /**
   * Bounds the answer to one statement, on the client side. Defaults to the statement timeout plus
   * QUERY_TIMEOUT_MARGIN_MS, so the server's own `statement_timeout` ends a slow statement first.
   */
  queryTimeoutMs?: number;
  /**
   * How long a transaction may sit idle between statements before the server ends its session
   * (`idle_in_transaction_session_timeout`): a client that stalls inside a transaction (a frozen
   * Lambda, a descheduled process) must not keep the scope's locks. Defaults to the statement
   * timeout: no protocol transaction waits on anything between two statements but this process.
   */
  idleInTransactionTimeoutMs?: number;
  /**
   * The whole transaction's bound (`transaction_timeout`, PostgreSQL 17 and later; ignored by an
   * older server). Defaults to the lock timeout plus two statement timeouts.
   */
  transactionTimeoutMs?: number;
  /** Called for errors on idle connections (e.g. a backend terminated while parked in the pool). */
  onIdleError?: (error: Error) => void;
}

/** How much longer than the statement timeout a client waits by default for a statement's answer. */
export const QUERY_TIMEOUT_MARGIN_MS = 5_000;

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
   * The server ended a session that sat idle inside a transaction longer than
   * idle_in_transaction_session_timeout (25P03), or a transaction that outlived
   * transaction_timeout (25P04, PostgreSQL 17+). The connection is gone; the work is retryable.
   */
  IDLE_IN_TRANSACTION_TIMEOUT: '25P03',
  TRANSACTION_TIMEOUT: '25P04',
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
  SQLSTATE.IDLE_IN_TRANSACTION_TIMEOUT,
  SQLSTATE.TRANSACTION_TIMEOUT,
]);

/** Maps a driver error onto the cleanup's error classes; programming errors pass through. */
export function translateDatabaseError(error: unknown): unknown {
  if (isCleanupError(error)) return error;
  const message = describeCause(error);
  if (isSystemError(error)) {
    // A socket's or resolver's failure (ECONNREFUSED, ENOTFOUND, ECONNRESET, EPIPE …). Its `code` is
    // Node's, not a SQLSTATE, though a few (EPIPE, EPERM) look like one: five capitals.
    return new DatabaseUnavailableError(`database connection failed: ${message}`, {}, { cause: error });
  }
  const sqlstate = (error as { code?: unknown })?.code;
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

/** Node's errors from sockets, TLS and DNS carry `errno` or `syscall`; the server's errors never do. */
function isSystemError(error: unknown): boolean {
  const fields = error as { errno?: unknown; syscall?: unknown } | null | undefined;
  return typeof fields?.errno === 'number' || typeof fields?.syscall === 'string';
}

/**
 * The words of a driver failure. A WebSocket failure reaches us as the `ws` library's ErrorEvent,
 * not an Error: printed as it is, an operator read "[object Object]" instead of "getaddrinfo
 * ENOTFOUND db.example".
 */
function describeCause(error: unknown): string {
  if (error instanceof Error) return error.message;
  const event = error as { message?: unknown; error?: unknown } | null | undefined;
  if (typeof event?.message === 'string' && event.message) return event.message;
  if (event?.error instanceof Error) return event.error.message;
  return String(error);
}

/**
 * Lost connections, and what keeps them from crashing the process.
 *
 * Both drivers (node-postgres, and its fork inside `@neondatabase/serverless`) report a dead
 * connection as an `'error'` event on the Client: its socket or WebSocket and its protocol
 * `connection` emit into it, and it re-emits there — a FATAL the server sends (57P01 when Neon
 * suspends or restarts a compute, or an RDS failover or reboot ends the session), a socket that
 * closed, a WebSocket error. An `'error'` event with no listener throws, and
 * uncaught it ends the process: in Lambda the whole batch fails and a release batch then waits out
 * its 1,080 s visibility timeout. The pool listens only while a client is idle; it stops the moment
 * it hands one over, and a promise-based `pool.connect()` resolves a microtask later, so a FATAL
 * that arrives in the same WebSocket frame as ReadyForQuery (or between a client's release and its
 * re-acquisition in one frame) is emitted while nobody listens. Reproduced with 30 workers and
 * `pg_terminate_backend`: a crash within seconds. So every client gets a listener in the pool's
 * `'connect'` event — pg-pool emits it synchronously once a new client has connected, while its own
 * idle listener is still on and before it hands the client over (the same in both drivers' pools) —
 * and keeps it for its whole life. The listener only marks the client broken: the statement in
 * flight fails by itself (the driver fails every queued query), and a broken client is discarded
 * on release instead of going back to the pool.
 */
const brokenClients = new WeakMap<DriverClient, Error>();

/**
 * How every connection renders timestamps, set once when it is opened. Both drivers parse a
 * timestamptz only from ISO text (`2026-12-05 07:08:10.123+00`); under a DateStyle a team may set
 * on its database or role (`ALTER DATABASE … SET DateStyle = 'SQL, DMY'`, German, Postgres) they
 * read every timestamp as null, and a reclaim brake, a due-leak order or a release's residual
 * deadline then reads null too. Every transaction pins both (beginTransactionStatement); this pins
 * them for the statements sent outside one (`query`, `queryOnce`), at one round trip per new
 * connection.
 *
 * A statement, not a startup parameter: PgBouncer 1.18 answers an `options` startup parameter
 * with "unsupported startup parameter: options" (or drops it, if told to ignore it), node-postgres
 * sends no other that could carry them, and what Neon's proxy does with startup parameters no
 * local run can show; a statement reaches the server on every path. Behind a transaction-mode
 * pooler it still holds: DateStyle and TimeZone are parameters PgBouncer tracks per client, and it
 * sets them on whichever server connection it gives this client next.
 */
const SESSION_SETTINGS = "SET DateStyle = 'ISO, MDY'; SET TimeZone = 'UTC'";

/** A bound ran out: retryable (the queue brings the record back), and never retried in-process. */
function timeoutError(phase: 'connect' | 'query', timeoutMs: number): DatabaseUnavailableError {
  return new DatabaseUnavailableError(
    phase === 'connect'
      ? `database connect timed out: no connection within ${timeoutMs} ms`
      : `database query timed out: no answer within ${timeoutMs} ms`,
    { timeout: phase, timeoutMs },
  );
}

/** The pool factory of the driver `url` is opened with (DATABASE_DRIVER, else by its host). */
function poolFactoryFor(url: string, options: DatabaseOptions): DriverPoolFactory {
  return databaseDriverFor(url, options.driver) === DatabaseDriver.NEON
    ? neonPoolFactory(options.wsProxy)
    : tcpPoolFactory();
}

export async function openDatabase(options: DatabaseOptions): Promise<PooledDatabase> {
  const connectTimeoutMs = Math.trunc(
    options.connectTimeoutMs ?? CONFIG_DEFAULTS.DATABASE_CONNECT_TIMEOUT_MS,
  );
  const queryTimeoutMs = Math.trunc(
    options.queryTimeoutMs ?? options.statementTimeoutMs + QUERY_TIMEOUT_MARGIN_MS,
  );
  const createPool = (url: string): DriverPool => {
    const makePool = poolFactoryFor(url, options);
    const created = makePool({
      connectionString: url,
      max: options.maxConnections ?? 10,
      // An idle socket is likelier to be dead (frozen Lambda, proxy idle timeout) than reusable.
      idleTimeoutMillis: 30_000,
      // The pool's own bound on a connect (and on a wait for a free slot): at it, the pool destroys
      // the half-open connection and frees its slot. `acquire` below answers the caller at the same
      // moment through its own timer, which the driver cannot delay.
      connectionTimeoutMillis: connectTimeoutMs,
    });
    created.on('connect', (client) => {
      client.on('error', (error: Error) => {
        if (!brokenClients.has(client)) brokenClients.set(client, error);
      });
      // Queued before the caller's first statement (a client runs its statements in order, and
      // pg-pool emits this before it hands the client over): SESSION_SETTINGS says why. Should it
      // fail, the connection is discarded on release rather than serve a session left unpinned.
      client.query(SESSION_SETTINGS).catch((error: Error) => {
        if (!brokenClients.has(client)) brokenClients.set(client, error);
      });
    });
    // An idle client whose backend is terminated emits 'error' on the pool too; unhandled, it would
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
  const retired: DriverPool[] = [];
  let rotating: Promise<boolean> | undefined;

  /**
   * After a rejected login: read the URL again (one read for all who were rejected by the same
   * pool) and, if it changed, continue on a new pool.
   */
  const rotate = (rejectedBy: DriverPool): Promise<boolean> => {
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
  const withCurrentCredentials = async <T>(work: (target: DriverPool) => Promise<T>): Promise<T> => {
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
  const idleInTransactionTimeoutMs = Math.trunc(options.idleInTransactionTimeoutMs ?? statementTimeoutMs);
  const transactionTimeoutMs = Math.trunc(
    options.transactionTimeoutMs ?? lockTimeoutMs + 2 * statementTimeoutMs,
  );
  const beginStatement = beginTransactionStatement({
    lockTimeoutMs,
    statementTimeoutMs,
    idleInTransactionTimeoutMs,
    transactionTimeoutMs,
  });
  const stats = { queries: 0, transactions: 0, reconnects: 0 };

  /**
   * A pooled client within `connectTimeoutMs`, or a retryable DatabaseUnavailableError. Without the
   * bound, a connect that is never answered (a compute that does not come back, a proxy that
   * accepts and stalls) hangs the record until Lambda kills the invocation, and the whole batch
   * gets no partial response. The timer starts before `pool.connect()`, so that at an equal
   * deadline it fires before the pool's own and the caller is told "connect timed out".
   */
  const acquire = async (target: DriverPool): Promise<DriverClient> => {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(timeoutError('connect', connectTimeoutMs)), connectTimeoutMs);
    });
    // As a promise even when the pool throws at once (pg builds the client inside connect(), and
    // reads the URL's certificate files there): thrown past this, the error went untranslated and
    // the timer above rejected later with nobody listening, which ends the process.
    const connecting = new Promise<DriverClient>((resolve) => resolve(target.connect()));
    try {
      return await Promise.race([connecting, timedOut]);
    } catch (error) {
      // A connect that lost the race may still complete: that client goes back, discarded (it
      // took longer than the bound, so its connection is suspect), and a late failure is dropped.
      connecting.then(
        (late) => late.release(new Error('connected after the connect timeout')),
        () => {},
      );
      throw translateDatabaseError(error);
    } finally {
      clearTimeout(timer);
    }
  };

  /**
   * One statement on `client`, answered within `queryTimeoutMs` or failed with a retryable
   * DatabaseUnavailableError. The server's own `statement_timeout` (shorter) normally ends a slow
   * statement first, with a clean error on a connection that stays usable; this bound is for an
   * answer that never comes (a dead network, a stalled proxy). The client is then marked broken:
   * its unanswered statement still occupies it, and it must never be reused.
   */
  const send = async <Row>(client: DriverClient, text: string, values?: readonly unknown[]) => {
    const result = await queryBounded(client, () => client.query(text, values as unknown[] | undefined));
    return { rows: result.rows as Row[], rowCount: result.rowCount ?? 0 };
  };

  /** One statement on `client` within the query timeout, its error translated. */
  const queryBounded = async <T>(client: DriverClient, query: () => Promise<T>): Promise<T> => {
    stats.queries += 1;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const error = timeoutError('query', queryTimeoutMs);
        if (!brokenClients.has(client)) brokenClients.set(client, error);
        reject(error);
      }, queryTimeoutMs);
    });
    try {
      return await Promise.race([query(), timedOut]);
    } catch (error) {
      throw translateDatabaseError(error);
    } finally {
      clearTimeout(timer);
    }
  };

  /**
   * The connection error to discard `client` with, or undefined when it can go back to the pool
   * (a SQL error, a lock timeout, a deadlock: the connection itself is fine).
   */
  const failureOf = (client: DriverClient, error: unknown): Error | undefined =>
    brokenClients.get(client) ??
    (isLostConnection(error) || isTimeout(error) ? (error as DatabaseUnavailableError) : undefined);

  const queryOnce = async <Row>(target: DriverPool, text: string, values?: readonly unknown[]) => {
    const client = await acquire(target);
    let broken: Error | undefined;
    try {
      return await send<Row>(client, text, values);
    } catch (error) {
      broken = failureOf(client, error);
      throw error;
    } finally {
      client.release(broken);
    }
  };

  const transactOnce = async <T>(target: DriverPool, work: (tx: Executor) => Promise<T>): Promise<T> => {
    const client = await acquire(target);
    stats.transactions += 1;
    let broken: Error | undefined;
    try {
      await send(client, beginStatement);
      const result = await work({ query: (text, values) => send(client, text, values) });
      await send(client, 'COMMIT');
      return result;
    } catch (error) {
      broken = await rollBackUnlessBroken(client, error);
      throw error;
    } finally {
      client.release(broken);
    }
  };

  /**
   * Ends a transaction that failed on `client`: a ROLLBACK when the connection is healthy. None on
   * a dead client (it would fail at once) or one whose statement timed out (it would queue behind
   * that statement forever): a discarded connection rolls back by itself. Returns what makes the
   * client unusable, for `release` to discard it, if anything does.
   */
  const rollBackUnlessBroken = async (client: DriverClient, error: unknown): Promise<Error | undefined> => {
    const broken = failureOf(client, error);
    if (broken) return broken;
    try {
      await send(client, 'ROLLBACK');
      return undefined;
    } catch (rollbackError) {
      return rollbackError as Error;
    }
  };

  /**
   * One message holding a whole transaction (`transactInOneMessage`). On an error the server skips
   * the rest of the message and the transaction is left aborted (its locks are already released
   * by then); the ROLLBACK that ends it is the only extra round trip.
   */
  const transactOnceInOneMessage = async (target: DriverPool, compose: (begin: string) => string) => {
    const client = await acquire(target);
    stats.transactions += 1;
    let broken: Error | undefined;
    try {
      return await sendMany(client, compose(beginStatement));
    } catch (error) {
      broken = await rollBackUnlessBroken(client, error);
      throw error;
    } finally {
      client.release(broken);
    }
  };

  const transactInOneMessage = (compose: (begin: string) => string) =>
    withCurrentCredentials((target) => onceMoreIfLost(() => transactOnceInOneMessage(target, compose)));

  /**
   * BEGIN, the bounds, the statement and COMMIT in one simple-query message: one round trip, and
   * the statement's locks are released by the COMMIT that follows it in the same message. The
   * results come back one per statement; the statement's is the one before COMMIT's. Its values
   * are inlined before a connection is taken: one that cannot be is refused without a trip.
   */
  const transact = async <Row>(text: string, values?: readonly unknown[], options?: TransactOptions) => {
    const statement = inlineParameters(text, values);
    const bounds = options?.waitForRowLocks ? '; SET LOCAL lock_timeout = 0' : '';
    const results = await transactInOneMessage((begin) => `${begin}${bounds}; ${statement}; COMMIT`);
    const result = results[results.length - 2]!;
    return { rows: result.rows as Row[], rowCount: result.rowCount };
  };

  /** A multi-statement simple query: one result per statement. */
  const sendMany = async (client: DriverClient, text: string): Promise<StatementResult[]> => {
    const result = (await queryBounded(client, () => client.query(text))) as unknown;
    const results = (Array.isArray(result) ? result : [result]) as {
      rows: unknown[];
      rowCount: number | null;
    }[];
    return results.map(({ rows, rowCount }) => ({ rows, rowCount: rowCount ?? 0 }));
  };

  /**
   * Runs `attempt` once more on a fresh connection when its connection was lost (never after a
   * timeout). `query` gets it as `withTransaction` and `transact` do; its deployed callers are
   * reads, all safe to repeat: the sweeper's stats, the reclaimer's classification and streaks,
   * and the operator CLI's reads (the writes go through `transact`, whose callers each say why
   * theirs is safe to repeat). `queryOnce` is for a write that must not run twice.
   */
  const onceMoreIfLost = async <T>(attempt: () => Promise<T>): Promise<T> => {
    try {
      return await attempt();
    } catch (error) {
      if (!isLostConnection(error)) throw error;
      stats.reconnects += 1;
      return attempt();
    }
  };

  return {
    stats,
    query: (text, values) =>
      withCurrentCredentials((target) => onceMoreIfLost(() => queryOnce(target, text, values))),
    queryOnce: (text, values) => withCurrentCredentials((target) => queryOnce(target, text, values)),
    withTransaction: (work) =>
      withCurrentCredentials((target) => onceMoreIfLost(() => transactOnce(target, work))),
    transact,
    transactInOneMessage,
    async end() {
      await Promise.all([...retired, pool].map((each) => each.end()));
    },
  };
}

export interface TransactionBounds {
  lockTimeoutMs: number;
  statementTimeoutMs: number;
  idleInTransactionTimeoutMs: number;
  transactionTimeoutMs: number;
}

/**
 * What opens every transaction, built once from validated integers (never from message text).
 *
 * READ COMMITTED explicitly: the decisions re-read under their locks what the lock's previous
 * holder committed, which only READ COMMITTED shows them; a database or role whose
 * `default_transaction_isolation` is higher must not change that (the decision functions refuse
 * to run otherwise). SET LOCAL (not SET) so that nothing outlives the transaction behind a
 * transaction-mode pooler. `transaction_timeout` exists from PostgreSQL 17 on: set_config is
 * called only where `current_setting(…, true)` finds the setting, so one text serves every server
 * without asking its version first.
 *
 * TimeZone and DateStyle pinned: a timestamp rendered as text must not depend on what the database,
 * the role or (behind a transaction-mode pooler) another client's session-level SET chose. The
 * decisions already emit and compare the fence as an instant; this is defence in depth for any
 * text rendering added later.
 */
export function beginTransactionStatement(bounds: TransactionBounds): string {
  for (const [name, value] of Object.entries(bounds)) {
    if (!Number.isSafeInteger(value) || value < 0) throw new Error(`${name} must be a non-negative integer`);
  }
  const { lockTimeoutMs, statementTimeoutMs, idleInTransactionTimeoutMs, transactionTimeoutMs } = bounds;
  return `BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, MDY'; SET LOCAL lock_timeout = ${lockTimeoutMs}; SET LOCAL statement_timeout = ${statementTimeoutMs}; SET LOCAL idle_in_transaction_session_timeout = ${idleInTransactionTimeoutMs}; SELECT set_config('transaction_timeout', '${transactionTimeoutMs}', true) WHERE current_setting('transaction_timeout', true) IS NOT NULL`;
}

/**
 * A connection-level failure worth one immediate retry on a fresh connection: no SQLSTATE from the
 * server (a socket or WebSocket error, a client the driver gave up on), the backend terminated
 * (57P01, what a Neon compute restart or suspend looks like), or class 08. A timeout is not one:
 * it has already spent its bound, and repeating it could double the time a record takes; the
 * queue's retry with backoff takes it from there.
 */
function isLostConnection(error: unknown): boolean {
  if (!(error instanceof DatabaseUnavailableError) || isTimeout(error)) return false;
  const sqlstate = error.details.sqlstate;
  return sqlstate === undefined || sqlstate === SQLSTATE.ADMIN_SHUTDOWN || String(sqlstate).startsWith('08');
}

/** A connect or a statement that ran out of its client-side bound. */
function isTimeout(error: unknown): boolean {
  return error instanceof DatabaseUnavailableError && error.details.timeout !== undefined;
}

/** For messages and logs: the URL with its password hidden. */
export function describeDatabase(url: string): string {
  return redactUrl(url);
}
