/**
 * The platform's workers, each renewing the leases of the runs it holds, one round every
 * ROUND_INTERVAL_MS. This is the measurement the project exists for: in the original design a
 * hung sandbox delete held the run's row lock and the scope's advisory lock inside a transaction,
 * and the lease reconciler's round queued behind it. Each round is logged with its longest
 * renewal, so the demo can show that renewals stay short while deletes hang.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { PlatformSimulator } from '../platform.ts';
import { PlatformMessage } from './lines.ts';
import type { PlatformLog } from './platform-log.ts';

export const ROUND_INTERVAL_MS = 100;

interface Worker {
  readonly id: string;
  readonly held: Set<string>;
}

export class LeaseWorkers {
  readonly #workers: Worker[];
  readonly #platform: PlatformSimulator;
  readonly #log: PlatformLog;
  readonly #stop = new AbortController();
  readonly #holder = new Map<string, Worker>();
  #next = 0;
  #loops: Promise<void>[] = [];

  constructor(count: number, platform: PlatformSimulator, log: PlatformLog) {
    this.#workers = Array.from({ length: count }, (_, index) => ({
      id: `worker-${index + 1}`,
      held: new Set(),
    }));
    this.#platform = platform;
    this.#log = log;
  }

  /** The worker the next root run goes to (round robin); its subagents stay on the same worker. */
  nextWorker(): string {
    const worker = this.#workers[this.#next % this.#workers.length]!;
    this.#next += 1;
    return worker.id;
  }

  hold(workerId: string, runId: string): void {
    const worker = this.#workers.find((candidate) => candidate.id === workerId) ?? this.#workers[0]!;
    worker.held.add(runId);
    this.#holder.set(runId, worker);
  }

  /** Stops renewing a run's lease (it finished, or its worker "lost" it). */
  drop(runId: string): void {
    this.#holder.get(runId)?.held.delete(runId);
    this.#holder.delete(runId);
  }

  start(): void {
    this.#loops = this.#workers.map((worker) => this.#loop(worker));
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    await Promise.all(this.#loops);
  }

  async #loop(worker: Worker): Promise<void> {
    const signal = this.#stop.signal;
    while (!signal.aborted) {
      const started = performance.now();
      let renewals = 0;
      let maxWaitMs = 0;
      for (const runId of [...worker.held]) {
        if (signal.aborted) break;
        try {
          const waitedMs = await this.#platform.renewLease(runId);
          renewals += 1;
          maxWaitMs = Math.max(maxWaitMs, waitedMs);
        } catch (error) {
          this.#log(
            PlatformMessage.LEASE_ROUND,
            { workerId: worker.id, runId, error: (error as Error).message },
            'WARN',
          );
        }
      }
      const roundMs = performance.now() - started;
      if (renewals > 0) {
        this.#log(PlatformMessage.LEASE_ROUND, {
          workerId: worker.id,
          renewals,
          maxWaitMs: round2(maxWaitMs),
          roundMs: round2(roundMs),
        });
      }
      try {
        await sleep(Math.max(0, ROUND_INTERVAL_MS - roundMs), undefined, { signal });
      } catch {
        // Aborted: the loop condition ends it.
      }
    }
  }
}

function round2(value: number): number {
  return Math.round(value * 100) / 100;
}
