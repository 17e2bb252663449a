/**
 * The platform's other transactions on the rows and advisory keys a cleanup locks, run while the
 * cleanups run (the ADR's failure surface: "recovery transactions for the same Run queue up behind
 * the locks, the AgentRun lease reconciler cannot finish its round of lease renewals"):
 *
 * - lease renewal: the lease reconciler's round, one autocommit UPDATE of a run row of a scope
 *   being cleaned up — the very root run row the cleanup locks `FOR UPDATE`. It needs that row's
 *   lock and nothing else.
 * - recovery transaction: the worker's same-scope recovery, in the cleanup's lock order: the
 *   scope's advisory lock (`runtime_cleanup_lock_key`), then the run row `FOR UPDATE`, then an
 *   update of it, then COMMIT.
 *
 * Each worker is open-loop: operation k is due at start + k × period. Latency is measured from
 * the due time, not from when a blocked worker finally got round to sending it, and the renewals
 * that fell due while a worker was blocked are recorded as waiting until it was free (HdrHistogram's
 * coordinated-omission correction). Without that, a renewal blocked for 2 s would count once, and
 * the hundreds that could not even be sent meanwhile would not count at all.
 *
 * It runs in a process of its own (`load-process-main.ts`), as the reconciler and the recovery
 * workers do in production: on the cleanups' event loop, a due time would be missed by that
 * loop's delay and GC pauses, and the latency would measure them instead of the lock waits.
 */
import type { Database } from '../../functions/adapters/database.ts';

export interface LoadTarget {
  runId: string;
  uid: string;
  runtimeScopeId: string;
}

export interface LoadOptions {
  workers: number;
  periodMs: number;
  random: () => number;
  /** The rows and scopes being cleaned up right now. */
  targets: () => readonly LoadTarget[];
  operation: (target: LoadTarget) => Promise<void>;
}

export interface LoadResult {
  /** Due time → completion, coordinated-omission corrected: the reported latency. */
  latenciesMs: number[];
  /** Send → completion of the operations really sent. */
  serviceMs: number[];
  operations: number;
  errors: string[];
}

export interface RunningLoad {
  /** Stops scheduling; resolves when every operation in flight has completed. */
  stop(): Promise<LoadResult>;
}

const RENEW_LEASE = `UPDATE agent_runs SET heartbeat_at = now(), updated_at = now() WHERE id = $1::text`;
const LOCK_SCOPE = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';
const LOCK_RUN = 'SELECT id FROM agent_runs WHERE id = $1::text FOR UPDATE';
const TOUCH_RUN = 'UPDATE agent_runs SET updated_at = now() WHERE id = $1::text';

export function renewLease(db: Database): (target: LoadTarget) => Promise<void> {
  return async (target) => {
    await db.query(RENEW_LEASE, [target.runId]);
  };
}

export function recoveryTransaction(db: Database): (target: LoadTarget) => Promise<void> {
  return (target) =>
    db.withTransaction(async (tx) => {
      await tx.query(LOCK_SCOPE, [target.uid, target.runtimeScopeId]);
      await tx.query(LOCK_RUN, [target.runId]);
      await tx.query(TOUCH_RUN, [target.runId]);
    });
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

export function startLoad(options: LoadOptions): RunningLoad {
  const result: LoadResult = { latenciesMs: [], serviceMs: [], operations: 0, errors: [] };
  const started = performance.now();
  let stopAt: number | undefined;

  const worker = async (index: number) => {
    // Staggered so the workers' operations spread over the period instead of arriving together.
    let due = started + (index * options.periodMs) / options.workers;
    for (;;) {
      await sleep(due - performance.now());
      if (stopAt !== undefined) return;
      const targets = options.targets();
      const target = targets[Math.floor(options.random() * targets.length)];
      if (!target) return;
      const sent = performance.now();
      try {
        await options.operation(target);
      } catch (error) {
        result.errors.push(error instanceof Error ? `${error.name}: ${error.message}` : String(error));
      }
      const ended = performance.now();
      result.operations += 1;
      result.serviceMs.push(ended - sent);
      result.latenciesMs.push(ended - due);
      // Operations that fell due while this one was blocked (and before the load was stopped)
      // would have waited until now: record them so a long block weighs as much as it lasted.
      due += options.periodMs;
      const horizon = Math.min(ended, stopAt ?? ended);
      while (due < horizon) {
        result.latenciesMs.push(ended - due);
        due += options.periodMs;
      }
      while (due < ended) due += options.periodMs;
    }
  };

  const workers = Array.from({ length: options.workers }, (_, index) => worker(index));
  return {
    async stop() {
      stopAt = performance.now();
      await Promise.all(workers);
      return result;
    },
  };
}
