/**
 * The protocol's only view of the database: a narrow executor and a transaction helper. The
 * protocol depends on this port, never on a driver; `functions/adapters/database.ts` implements it
 * with the Neon driver, and tests or a platform's own transaction can implement it too.
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
   * Runs `work` in one transaction with `lock_timeout` and `statement_timeout` set locally:
   * commits on success, rolls back on any error, and discards a connection that broke. A
   * transaction whose connection died (a stale socket after a Lambda freeze, a terminated
   * backend) is run once more on a fresh connection, so `work` must be safe to repeat — every
   * cleanup transaction is: it re-reads what it decides on under its locks.
   */
  withTransaction<T>(work: (tx: Executor) => Promise<T>): Promise<T>;
  /** Round trips and transactions so far: the benchmarks report them per cleanup. */
  readonly stats: { queries: number; transactions: number };
  end(): Promise<void>;
}
