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
 * - a stack holder is retried until `windowMs` (longer than any legitimate cleanup transaction,
 *   i.e. the lock timeout plus a margin). Still held by the stack after it — with the DELETE held
 *   up meanwhile, since the provisioner waits for the probe — means a cleanup transaction spans
 *   the external call: a violation, reported with the holder's state and last statement.
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
}

export type ProbeVerdict =
  | { kind: 'free'; attempts: number }
  | { kind: 'held_by_chaos'; attempts: number; holders: LockHolder[] }
  | { kind: 'held_by_cleanup_transiently'; attempts: number; holders: LockHolder[] }
  /** Refused every time, but the holder was gone each time we looked: nobody to blame or clear. */
  | { kind: 'unattributed'; attempts: number }
  | { kind: 'violation'; attempts: number; heldForMs: number; holders: LockHolder[] };

const TRY_SCOPE_LOCK =
  'SELECT pg_try_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text)) AS acquired';
const LOCK_SCOPE_ROWS_NOWAIT =
  'SELECT id FROM agent_runs WHERE uid = $1::text AND runtime_scope_id = $2::text FOR UPDATE NOWAIT';

/** Who holds the scope's advisory lock, and who holds a row lock on a run of the scope right now. */
const LOCK_HOLDERS = `
  SELECT a.pid, a.application_name, a.state, left(a.query, 300) AS query, 'advisory' AS lock
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
  WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND ((l.classid::bigint << 32) | l.objid::bigint) = runtime_cleanup_lock_key($1::text, $2::text)
  UNION ALL
  SELECT a.pid, a.application_name, a.state, left(a.query, 300), 'row'
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
    let attempts = 0;
    let sawStack = false;
    let lastHolders: LockHolder[] = [];
    for (;;) {
      attempts += 1;
      const holders = await this.#tryOnce(scope);
      if (holders === undefined) {
        return sawStack
          ? { kind: 'held_by_cleanup_transiently', attempts, holders: lastHolders }
          : { kind: 'free', attempts };
      }
      const elapsedMs = performance.now() - started;
      if (holders.length === 0) {
        // Released between the refused try and the look at pg_locks: try again.
        if (elapsedMs >= this.windowMs) return { kind: 'unattributed', attempts };
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
      if (elapsedMs >= this.windowMs) {
        return { kind: 'violation', attempts, heldForMs: elapsedMs, holders: stackHolders };
      }
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }

  /** Undefined when both locks were had; else who holds them. */
  async #tryOnce(scope: ScopeKey): Promise<LockHolder[] | undefined> {
    const values = [scope.uid, scope.runtimeScopeId];
    try {
      await this.db.withTransaction(async (tx) => {
        const { rows } = await tx.query<{ acquired: boolean }>(TRY_SCOPE_LOCK, values);
        if (!rows[0]?.acquired) throw new HeldError('advisory lock held');
        await tx.query(LOCK_SCOPE_ROWS_NOWAIT, values);
      });
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
    }>(LOCK_HOLDERS, values);
    return rows.map((row) => ({
      pid: row.pid,
      applicationName: row.application_name,
      state: row.state,
      query: row.query,
      lock: row.lock,
    }));
  }
}
