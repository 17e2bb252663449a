/**
 * The benchmark's view of a one-trip transaction (issue 15's lock hold), from outside the product:
 * a `transact` that sends the product's message (BEGIN and the bounds, the statement, COMMIT:
 * `Database.transact`) with three constant statements around the statement, through the adapter's
 * `transactInOneMessage`, and tells an observer, once answered:
 *
 * - the message's round trip as this process saw it, from just before it was sent on its
 *   connection (a wait for a pool slot is not in it) to its answer;
 * - the server's time on it, from its receipt to just after its COMMIT;
 * - how long the decision held the scope's lock, on the server's clock, from the moment the
 *   benchmark's instrumented functions note (`runtime_cleanup.lock_taken_at`:
 *   instrumented-functions.ts) to just after the COMMIT.
 *
 * The extra statements cost the server two small reads and a SET, and the trip nothing: the
 * message is still one.
 */
import type { Database, PooledDatabase, StatementResult } from '../../functions/adapters/database.ts';
import { inlineParameters } from '../../functions/adapters/sql-literal.ts';
import type { TransactOptions } from '../../functions/cleanup/executor.ts';

/** What an observed one-trip transaction reports. */
export interface RoundTripTiming {
  /** Sent on its connection → answered, as this process saw it (its event-loop delay included). */
  roundTripMs: number;
  /**
   * The server's own time on the message: from its receipt (`statement_timestamp()`, which
   * PostgreSQL sets once per simple-query message) to just after its COMMIT. Waits for locks are
   * in it; the trip back and this process's delay are not.
   */
  serverMs: number;
  /**
   * The scope's advisory lock (and the row locks taken after it) held: from when the decision
   * took it (`runtime_cleanup.lock_taken_at`) to just after the COMMIT, on the server's clock.
   * Only the benchmark's instrumented functions note it: null on a product database, and when the
   * statement took no such lock.
   */
  lockHeldMs: number | null;
}

export type RoundTripObserver = (timing: RoundTripTiming) => void;

/**
 * Sent before the statement: `runtime_cleanup_note_lock_taken` keeps a value it finds (the first
 * lock of the transaction starts the hold), and the setting is an ordinary placeholder that can
 * already hold one here: a database or role default, or a session-level SET left on a server
 * connection a transaction-mode pooler hands on. Local, so the connection's own value is back
 * after COMMIT.
 */
const FORGET_LOCK_TAKEN_AT = "SET LOCAL runtime_cleanup.lock_taken_at = ''";
/** Read before COMMIT: the local setting ends with the transaction. */
const LOCK_TAKEN_AT = "SELECT current_setting('runtime_cleanup.lock_taken_at', true) AS lock_taken_at";
/** Read after COMMIT: the locks are gone; the message's receipt is still `statement_timestamp()`. */
const SERVER_CLOCK =
  'SELECT extract(epoch FROM clock_timestamp())::text AS now, extract(epoch FROM statement_timestamp())::text AS received';

/**
 * `Database.transact`, observed: the same one message with the readings around the statement.
 * `compose` runs once the connection is in hand, right before the message is sent, so the round
 * trip starts there (and again on the adapter's one retry after a lost connection).
 */
export function observedTransact(
  db: Pick<PooledDatabase, 'transactInOneMessage'>,
  observe: RoundTripObserver,
): Database['transact'] {
  return async <Row>(text: string, values?: readonly unknown[], options?: TransactOptions) => {
    const statement = inlineParameters(text, values);
    // As the product's transact sends it (functions/adapters/database.ts).
    const bounds = options?.waitForRowLocks ? '; SET LOCAL lock_timeout = 0' : '';
    let sentAt = performance.now();
    const results = await db.transactInOneMessage((begin) => {
      sentAt = performance.now();
      return `${begin}${bounds}; ${FORGET_LOCK_TAKEN_AT}; ${statement}; ${LOCK_TAKEN_AT}; COMMIT; ${SERVER_CLOCK}`;
    });
    const roundTripMs = performance.now() - sentAt;
    observe(serverTiming(roundTripMs, results));
    // The statement's result: before the lock-taken read, COMMIT and the clock.
    const result = results[results.length - 4]!;
    return { rows: result.rows as Row[], rowCount: result.rowCount };
  };
}

/** `db`, with every `transact` observed; everything else is `db`'s own. */
export function observeTransactions(db: PooledDatabase, observe: RoundTripObserver): PooledDatabase {
  return {
    get stats() {
      return db.stats;
    },
    query: (text, values) => db.query(text, values),
    queryOnce: (text, values) => db.queryOnce(text, values),
    withTransaction: (work) => db.withTransaction(work),
    transactInOneMessage: (compose) => db.transactInOneMessage(compose),
    transact: observedTransact(db, observe),
    end: () => db.end(),
  };
}

function serverTiming(roundTripMs: number, results: readonly StatementResult[]): RoundTripTiming {
  const taken = (results[results.length - 3]!.rows[0] as { lock_taken_at: string | null }).lock_taken_at;
  const clock = results[results.length - 1]!.rows[0] as { now: string; received: string };
  const now = Number(clock.now);
  return {
    roundTripMs,
    serverMs: (now - Number(clock.received)) * 1000,
    lockHeldMs: taken ? (now - Number(taken)) * 1000 : null,
  };
}
