/**
 * Invariant 3's probe: while a provisioner DELETE is in flight (the provisioner awaits this
 * before handling it), take, from another connection, the scope's advisory lock with a try-lock
 * and the row locks of every run of the scope with `FOR UPDATE NOWAIT`. If the cleanup held any
 * of them across its external call, the probe could not have them.
 *
 * A failed try is not yet a violation: the chaos suite's own platform and lock-holder connections
 * take the same locks on purpose, and another cleanup transaction of the same scope may hold them
 * for a few milliseconds (or up to the lock timeout while it waits for a row lock). So the holder
 * is identified (pg_locks for the advisory lock; the row's xmax against each backend's current
 * transaction id for row locks) by its `application_name`:
 *
 * - a holder that is not the stack's connection is the chaos suite's doing and is not counted;
 * - a stack holder is looked at again and again. A hold is timed from the FIRST SIGHTING of the
 *   same backend (pid) in the same transaction (`xact_start`, and `backend_xid` once it has one)
 *   to its latest sighting, and it counts only once seen at least twice: the probe's own delay
 *   (a slow first query on a loaded machine) and a new transaction that reused the pooled
 *   backend are never added to it. A hold that spans `windowMs` (longer than any legitimate
 *   cleanup transaction, i.e. the lock timeout plus a margin), with the DELETE held up
 *   meanwhile since the provisioner waits for the probe, means a cleanup transaction spans the
 *   external call: a violation, reported with the holder's state and last statement.
 *
 * Timing a hold from the probe's start once reported a 1,671 ms hold from a single sighting that
 * was mostly the probe's own delay; `HoldTracker` is the rule, unit-tested with synthetic
 * sightings (test/harness/chaos-lock-hold.test.ts).
 */
import { type Database, SQLSTATE } from '../../functions/adapters/database.ts';
import { isCleanupError } from '../../functions/cleanup/errors.ts';

export interface ScopeKey {
  uid: string;
  runtimeScopeId: string;
}

export interface LockHolder {
  pid: number;
  applicationName: string;
  state: string | null;
  query: string;
  lock: 'advisory' | 'row';
  /** The holder's transaction: `pg_stat_activity.xact_start` (text, microseconds) … */
  xactStart: string | null;
  /** … and its `backend_xid`, when it has one (a transaction that wrote something). */
  backendXid: string | null;
}

/** One look at who holds the scope's locks, at `atMs` (performance.now()). */
export interface Sighting {
  atMs: number;
  holders: readonly LockHolder[];
}

/** A hold of one transaction of one backend, from its first to its latest sighting. */
export interface Hold {
  pid: number;
  xactStart: string | null;
  firstSeenMs: number;
  lastSeenMs: number;
  sightings: number;
  /** lastSeen − firstSeen: a lower bound of how long the transaction held the lock. */
  heldMs: number;
  holders: LockHolder[];
}

/**
 * Times holds from sightings. The identity of a hold is (pid, xact_start): a pooled backend that
 * committed and began another transaction starts a new hold. A backend_xid seen for a hold must
 * stay the same (an xid appears when a transaction first writes, and never changes within it), so
 * a different one also starts a new hold.
 */
export class HoldTracker {
  readonly #holds = new Map<string, Hold>();

  see(sighting: Sighting): void {
    const byTransaction = new Map<string, LockHolder[]>();
    for (const holder of sighting.holders) {
      const key = `${holder.pid}/${holder.xactStart ?? 'no-transaction'}`;
      byTransaction.set(key, [...(byTransaction.get(key) ?? []), holder]);
    }
    for (const [key, holders] of byTransaction) {
      const xid = holders.find((holder) => holder.backendXid !== null)?.backendXid ?? null;
      const known = this.#holds.get(key);
      const knownXid = known?.holders.find((holder) => holder.backendXid !== null)?.backendXid ?? null;
      if (known && (xid === null || knownXid === null || xid === knownXid)) {
        known.lastSeenMs = Math.max(known.lastSeenMs, sighting.atMs);
        known.sightings += 1;
        known.heldMs = known.lastSeenMs - known.firstSeenMs;
        known.holders = holders;
        continue;
      }
      this.#holds.set(key, {
        pid: holders[0]!.pid,
        xactStart: holders[0]!.xactStart,
        firstSeenMs: sighting.atMs,
        lastSeenMs: sighting.atMs,
        sightings: 1,
        heldMs: 0,
        holders,
      });
    }
  }

  /** The longest hold seen at least twice; undefined when none was. */
  longest(): Hold | undefined {
    let best: Hold | undefined;
    for (const hold of this.#holds.values()) {
      if (hold.sightings < 2) continue;
      if (!best || hold.heldMs > best.heldMs) best = hold;
    }
    return best;
  }

  /** When the earliest hold still being tracked was first seen (undefined before any sighting). */
  firstSeenMs(): number | undefined {
    let first: number | undefined;
    for (const hold of this.#holds.values()) first = Math.min(first ?? hold.firstSeenMs, hold.firstSeenMs);
    return first;
  }
}

/**
 * The verdict a series of sightings supports: a violation only when one transaction of the stack
 * was seen at least twice, at least `windowMs` apart.
 */
export function holdVerdict(
  tracker: HoldTracker,
  windowMs: number,
): { violation: true; hold: Hold } | { violation: false } {
  const hold = tracker.longest();
  return hold && hold.heldMs >= windowMs ? { violation: true, hold } : { violation: false };
}

export type ProbeVerdict =
  | { kind: 'free'; attempts: number }
  | { kind: 'held_by_chaos'; attempts: number; holders: LockHolder[] }
  | { kind: 'held_by_cleanup_transiently'; attempts: number; holders: LockHolder[] }
  /** Refused every time, but the holder was gone each time we looked: nobody to blame or clear. */
  | { kind: 'unattributed'; attempts: number }
  | {
      kind: 'violation';
      attempts: number;
      /** From the first to the latest sighting of the same backend and transaction (≥ 2 sightings). */
      heldForMs: number;
      sightings: number;
      holders: LockHolder[];
    };

/**
 * Both tries in one statement, sent as a whole transaction in one round trip (`Database.transact`:
 * BEGIN, the statement, COMMIT in one message): the DELETE waits for the probe, so every round
 * trip here is time taken from the request's own timeout. Four round trips (BEGIN, the two tries,
 * COMMIT) cost a loaded chaos machine 0.2–0.7 s per DELETE and made fault-free DELETEs miss their
 * 1 s timeout. A row that another transaction holds fails the statement with 55P03 (NOWAIT);
 * a held advisory lock answers `acquired = false`. Both locks end with the COMMIT in the same message.
 */
const TRY_SCOPE_LOCKS = `
  SELECT pg_try_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text)) AS acquired,
         (SELECT count(*) FROM (SELECT id FROM agent_runs
                                WHERE uid = $1::text AND runtime_scope_id = $2::text
                                FOR UPDATE NOWAIT) AS scope_rows)::int AS rows_locked`;

/** Who holds the scope's advisory lock, and who holds a row lock on a run of the scope right now. */
const LOCK_HOLDERS = `
  SELECT a.pid, a.application_name, a.state, left(a.query, 300) AS query, 'advisory' AS lock,
         a.xact_start::text AS xact_start, a.backend_xid::text AS backend_xid
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
  WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND ((l.classid::bigint << 32) | l.objid::bigint) = runtime_cleanup_lock_key($1::text, $2::text)
  UNION ALL
  SELECT a.pid, a.application_name, a.state, left(a.query, 300), 'row',
         a.xact_start::text, a.backend_xid::text
  FROM agent_runs r JOIN pg_stat_activity a ON a.backend_xid = r.xmax
  WHERE r.uid = $1::text AND r.runtime_scope_id = $2::text AND a.pid <> pg_backend_pid()`;

class HeldError extends Error {}

function isLockNotAvailable(error: unknown): boolean {
  if (error instanceof HeldError) return true;
  const sqlstate = isCleanupError(error)
    ? error.details.sqlstate
    : (error as { code?: unknown } | null | undefined)?.code;
  return sqlstate === SQLSTATE.LOCK_NOT_AVAILABLE;
}

export class LockProbe {
  constructor(
    private readonly db: Database,
    private readonly stackApplicationName: string,
    private readonly windowMs: number,
  ) {}

  async probe(scope: ScopeKey): Promise<ProbeVerdict> {
    const started = performance.now();
    const tracker = new HoldTracker();
    let attempts = 0;
    let sawStack = false;
    let lastHolders: LockHolder[] = [];
    // Looked at for a window after the first sighting of a stack holder (plus one look's worth of
    // slack), and never longer than three windows in all: the DELETE waits for the probe.
    const lookUntil = () => {
      const first = tracker.firstSeenMs();
      return Math.min(started + 3 * this.windowMs, (first ?? started) + this.windowMs + 100);
    };
    for (;;) {
      attempts += 1;
      const holders = await this.#tryOnce(scope);
      const now = performance.now();
      if (holders === undefined) {
        return sawStack
          ? { kind: 'held_by_cleanup_transiently', attempts, holders: lastHolders }
          : { kind: 'free', attempts };
      }
      if (holders.length === 0) {
        // Released between the refused try and the look at pg_locks: try again.
        if (now >= started + 3 * this.windowMs) return { kind: 'unattributed', attempts };
        await new Promise((resolve) => setTimeout(resolve, 5));
        continue;
      }
      const stackHolders = holders.filter((holder) => holder.applicationName === this.stackApplicationName);
      if (stackHolders.length === 0) {
        // The chaos suite's own connections (or a holder gone between the two queries).
        if (sawStack) return { kind: 'held_by_cleanup_transiently', attempts, holders: lastHolders };
        return { kind: 'held_by_chaos', attempts, holders };
      }
      sawStack = true;
      lastHolders = stackHolders;
      tracker.see({ atMs: now, holders: stackHolders });
      const verdict = holdVerdict(tracker, this.windowMs);
      if (verdict.violation) {
        return {
          kind: 'violation',
          attempts,
          heldForMs: verdict.hold.heldMs,
          sightings: verdict.hold.sightings,
          holders: verdict.hold.holders,
        };
      }
      if (now >= lookUntil()) return { kind: 'held_by_cleanup_transiently', attempts, holders: lastHolders };
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }

  /** Undefined when both locks were had; else who holds them. */
  async #tryOnce(scope: ScopeKey): Promise<LockHolder[] | undefined> {
    const values = [scope.uid, scope.runtimeScopeId];
    try {
      const { rows } = await this.db.transact<{ acquired: boolean }>(TRY_SCOPE_LOCKS, values);
      if (!rows[0]?.acquired) throw new HeldError('advisory lock held');
      return undefined;
    } catch (error) {
      if (!isLockNotAvailable(error)) throw error;
    }
    const { rows } = await this.db.query<{
      pid: number;
      application_name: string;
      state: string | null;
      query: string;
      lock: 'advisory' | 'row';
      xact_start: string | null;
      backend_xid: string | null;
    }>(LOCK_HOLDERS, values);
    return rows.map((row) => ({
      pid: row.pid,
      applicationName: row.application_name,
      state: row.state,
      query: row.query,
      lock: row.lock,
      xactStart: row.xact_start,
      backendXid: row.backend_xid,
    }));
  }
}
