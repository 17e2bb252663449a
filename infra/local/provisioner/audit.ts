import { AUDIT_OUTCOME, type AuditEntry, type AuditOutcome } from './types.ts';

interface ArrivalWaiter {
  readonly predicate: (entry: AuditEntry) => boolean;
  readonly resolve: (entry: AuditEntry) => void;
}

/** Wall-clock milliseconds with sub-millisecond precision, comparable across entries. */
function preciseNow(): number {
  return performance.timeOrigin + performance.now();
}

/**
 * The record of every API request, and the count of those still being handled. Entries are
 * mutable here and handed out only as copies, so a test cannot change what it asserts on.
 * The oldest entries are dropped past `limit` so a long benchmark cannot grow it forever.
 */
export class AuditLog {
  readonly #entries: AuditEntry[] = [];
  readonly #pending = new Set<AuditEntry>();
  readonly #arrivalWaiters = new Set<ArrivalWaiter>();
  /** Entries whose sandbox id and generation are known; only these are matched. */
  readonly #announced = new WeakSet<AuditEntry>();
  readonly #limit: number;
  #nextSeq = 1;

  constructor(limit: number) {
    this.#limit = limit;
  }

  /** Opens an entry for a request that has just arrived; it counts as in flight until `finish`. */
  open(method: string, path: string): AuditEntry {
    const startedAt = preciseNow();
    const entry: AuditEntry = {
      seq: this.#nextSeq++,
      at: Math.floor(startedAt),
      method,
      path,
      outcome: AUDIT_OUTCOME.pending,
      startedAt,
    };
    this.#entries.push(entry);
    if (this.#entries.length > this.#limit) this.#entries.shift();
    this.#pending.add(entry);
    return entry;
  }

  /**
   * Announces that the entry's request has been identified (sandbox id and generation are
   * filled in) and is about to be handled; resolves the `waitForArrival` calls it matches.
   */
  announce(entry: AuditEntry): void {
    this.#announced.add(entry);
    for (const waiter of this.#arrivalWaiters) {
      if (!waiter.predicate({ ...entry })) continue;
      this.#arrivalWaiters.delete(waiter);
      waiter.resolve({ ...entry });
    }
  }

  /** Closes an entry with its final outcome; only the first call counts. */
  finish(entry: AuditEntry, outcome: Exclude<AuditOutcome, 'pending'>): void {
    if (!this.#pending.delete(entry)) return;
    entry.outcome = outcome;
    entry.endedAt = preciseNow();
  }

  inFlight(): number {
    return this.#pending.size;
  }

  entries(): AuditEntry[] {
    return this.#entries.map((entry) => ({ ...entry }));
  }

  /**
   * Resolves with (a copy of) the first request matching `predicate`: one already in flight
   * (so a caller that sends first and waits second cannot miss it), else the next to arrive.
   * Rejects after `timeoutMs`.
   */
  waitForArrival(predicate: (entry: AuditEntry) => boolean, timeoutMs: number): Promise<AuditEntry> {
    for (const entry of this.#pending) {
      if (this.#announced.has(entry) && predicate({ ...entry })) return Promise.resolve({ ...entry });
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#arrivalWaiters.delete(waiter);
        reject(new Error(`no matching provisioner request arrived within ${timeoutMs} ms`));
      }, timeoutMs);
      const waiter: ArrivalWaiter = {
        predicate,
        resolve: (entry) => {
          clearTimeout(timer);
          resolve(entry);
        },
      };
      this.#arrivalWaiters.add(waiter);
    });
  }
}
