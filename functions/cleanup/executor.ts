/**
 * The protocol's only view of the database: a narrow executor and a transaction helper. The
 * protocol depends on this port, never on a driver; `functions/adapters/database.ts` implements it
 * over either PostgreSQL driver (Neon's serverless driver or node-postgres over TCP:
 * DATABASE_DRIVER), and tests or a platform's own transaction can implement it too.
 */

/** The narrow seam every data function takes, so it runs inside or outside a caller's transaction. */
export interface Executor {
  query<Row = Record<string, unknown>>(
    text: string,
    values?: readonly unknown[],
  ): Promise<{ rows: Row[]; rowCount: number }>;
}

export interface Database extends Executor {
  /**
   * A plain statement (autocommit, no transaction held open), at the session's default isolation:
   * for reads. The product's writes go through `transact` (test/unit/sql-rules.test.ts). Sent once
   * more on a fresh connection when its connection is lost before the answer (a terminated backend,
   * a dead socket), as a transaction is, so it must be safe to repeat.
   */
  query<Row = Record<string, unknown>>(
    text: string,
    values?: readonly unknown[],
  ): Promise<{ rows: Row[]; rowCount: number }>;
  /**
   * The same statement sent at most once, for a write that must not run twice (an INSERT of a new
   * row, a status change whose second run would answer differently). Its connection failures reach
   * the caller as they are.
   */
  queryOnce<Row = Record<string, unknown>>(
    text: string,
    values?: readonly unknown[],
  ): Promise<{ rows: Row[]; rowCount: number }>;
  /**
   * Runs `work` in one transaction with `lock_timeout` and `statement_timeout` set locally:
   * commits on success, rolls back on any error, and discards a connection that broke. A
   * transaction whose connection died (a stale socket after a Lambda freeze, a terminated
   * backend) is run once more on a fresh connection, so `work` must be safe to repeat — every
   * cleanup transaction is: it re-reads what it decides on under its locks.
   */
  withTransaction<T>(work: (tx: Executor) => Promise<T>): Promise<T>;
  /**
   * One statement as a whole transaction, sent in ONE round trip: BEGIN ISOLATION LEVEL READ
   * COMMITTED, the same SET LOCAL bounds as `withTransaction`, the statement, COMMIT, all in one
   * message. A lock the statement takes is therefore never held while anything travels between
   * this process and the database. For the protocol's decision functions (phases 1 and 3, the
   * release and reclaim guards) and for every bookkeeping write (ending a delete-in-flight record,
   * the reclaimer's sightings and settings of record, the sweeper's claims): none of them may run
   * at the database's or role's `default_transaction_isolation`, where a write that waited on a
   * row another session changed fails with SQLSTATE 40001 instead of re-checking it
   * (test/unit/sql-rules.test.ts refuses a write sent through `query`). Repeated once on a fresh
   * connection after a lost connection, as a transaction is, so the statement must be safe to
   * repeat.
   */
  transact<Row = Record<string, unknown>>(
    text: string,
    values?: readonly unknown[],
    options?: TransactOptions,
  ): Promise<{ rows: Row[]; rowCount: number }>;
  /**
   * Messages sent to the server and transactions begun so far, and how often a statement or
   * transaction was sent again after a lost connection: what the integration tests count to hold
   * the adapter to its contract (one round trip per decision, one retry on a lost connection),
   * and what the benchmark reports as round trips per cleanup (docs/capacity.md).
   */
  readonly stats: { queries: number; transactions: number; reconnects: number };
  end(): Promise<void>;
}

/** The options of a bookkeeping write (TransactOptions.waitForRowLocks): one spelling for all of them. */
export const WAIT_FOR_ROW_LOCKS: TransactOptions = { waitForRowLocks: true };

export interface TransactOptions {
  /**
   * Wait for a row lock as long as the statement timeout allows (`lock_timeout = 0` for this
   * transaction), not `DATABASE_LOCK_TIMEOUT_MS`. For the bookkeeping writes that end a quarantine
   * or record what was seen: they take no advisory lock and hold nothing another session waits
   * for while they wait, and giving up after the lock timeout (where, as autocommit statements,
   * they used to wait) would keep a scope quarantined for a whole hold after a confirmed delete,
   * or fail a reclaimer or sweeper run, only because the platform held the row a few seconds.
   */
  readonly waitForRowLocks?: boolean;
}
