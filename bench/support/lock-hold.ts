/**
 * Lock hold times measured from the client, without touching production code: a Database wrapper
 * whose `withTransaction` hands the work an executor that timestamps the moment the scope's
 * advisory lock statement and the run's `FOR UPDATE` statement return, and the moment the
 * transaction's COMMIT (or ROLLBACK) returns. The difference is the time the lock was held as
 * seen by the holder; it overstates the server-side hold by at most one round trip (~0.3 ms here),
 * the same for both designs.
 */
import type { Database, Executor, PooledDatabase } from '../../functions/adapters/database.ts';
import { observedTransact, type RoundTripTiming } from './observed-transactions.ts';

export interface LockHoldSample {
  /** Which transaction: `fence-check`, `finalize` (split), `floor check`, `floor clear` or `baseline`. */
  phase: string;
  /** Advisory lock statement returned → COMMIT returned; null if the transaction never took it. */
  advisoryMs: number | null;
  /** `FOR UPDATE` statement returned → COMMIT returned; null if the transaction never took it. */
  rowMs: number | null;
  /** BEGIN sent → COMMIT returned, lock waits included. */
  transactionMs: number;
  /**
   * One-trip transactions only (null otherwise): the hold on the server's clock, from when the
   * decision took the scope's advisory lock to just after its COMMIT (noted: bench/support/instrumented-functions.ts), without the
   * trip back or this process's event-loop delay, which come after the locks are gone.
   */
  serverHeldMs: number | null;
  /** One-trip transactions only: the server's time on the whole message, lock waits included. */
  serverMessageMs: number | null;
  /**
   * Round trips made while the advisory lock was held, COMMIT included. Each one costs the holder
   * a full trip through driver, bridge and server, and under load a wait behind everyone else's:
   * it is what a lock hold is made of (plus, in the baseline, the HTTP delete).
   */
  roundTripsUnderLock: number;
  failed: boolean;
}

const ADVISORY_LOCK_STATEMENT = /pg_advisory_xact_lock/;
const ROW_LOCK_STATEMENT = /\bFOR\s+UPDATE\b/i;

export function withLockHoldProbe(
  db: PooledDatabase,
  phase: string,
  record: (sample: LockHoldSample) => void,
): Database {
  return {
    stats: db.stats,
    query: (text, values) => db.query(text, values),
    queryOnce: (text, values) => db.queryOnce(text, values),
    end: () => db.end(),
    /**
     * A one-round-trip transaction (BEGIN, the decision, COMMIT in one message): the server takes
     * and releases the locks while handling that one message, so the hold is at most the
     * message's round trip on its connection (observed-transactions.ts times it; a wait for a pool
     * slot is not in it), and no other trip happens under the lock.
     */
    async transact(text, values) {
      const started = performance.now();
      let roundTripMs: number | undefined;
      let timing: RoundTripTiming | undefined;
      let failed = false;
      try {
        const transact = observedTransact(db, (observed) => {
          roundTripMs = observed.roundTripMs;
          timing = observed;
        });
        return await transact(text, values);
      } catch (error) {
        failed = true;
        throw error;
      } finally {
        record({
          phase,
          advisoryMs: roundTripMs ?? null,
          rowMs: roundTripMs ?? null,
          transactionMs: performance.now() - started,
          serverHeldMs: timing?.lockHeldMs ?? null,
          serverMessageMs: timing?.serverMs ?? null,
          roundTripsUnderLock: roundTripMs === undefined ? 0 : 1,
          failed,
        });
      }
    },
    async withTransaction(work) {
      const started = performance.now();
      let advisoryAt: number | undefined;
      let rowAt: number | undefined;
      let roundTripsUnderLock = 0;
      let failed = false;
      try {
        return await db.withTransaction((tx) => {
          const probe: Executor = {
            async query<Row>(text: string, values?: readonly unknown[]) {
              const result = await tx.query<Row>(text, values);
              const returned = performance.now();
              if (advisoryAt !== undefined) roundTripsUnderLock += 1;
              if (advisoryAt === undefined && ADVISORY_LOCK_STATEMENT.test(text)) advisoryAt = returned;
              if (rowAt === undefined && ROW_LOCK_STATEMENT.test(text)) rowAt = returned;
              return result;
            },
          };
          return work(probe);
        });
      } catch (error) {
        failed = true;
        throw error;
      } finally {
        const ended = performance.now();
        record({
          phase,
          advisoryMs: advisoryAt === undefined ? null : ended - advisoryAt,
          rowMs: rowAt === undefined ? null : ended - rowAt,
          transactionMs: ended - started,
          serverHeldMs: null,
          serverMessageMs: null,
          // + 1: the COMMIT (or ROLLBACK), sent by withTransaction itself.
          roundTripsUnderLock: advisoryAt === undefined ? 0 : roundTripsUnderLock + 1,
          failed,
        });
      }
    },
  };
}
