/**
 * The demo workload: what the agent platform does, through `PlatformSimulator`, which does it
 * the platform's way. Conversations (each with its Workdir and runtime scope) run one root run
 * at a time; a root run is admitted only while `runtime_cleanup_blocked` says the scope is free,
 * acquires its sandbox from the provisioner (a real process), may start subagent runs, is
 * held and renewed by a worker, and ends in one of the terminal statuses, which sets the fence
 * and announces `run-finished`. The next run of the conversation then waits for the cleanup.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { TERMINAL_RUN_STATUSES } from '../../run-statuses.ts';
import type { AdmittedRun, PlatformSimulator, ScopeRef } from '../platform.ts';
import { LeaseWorkers } from './leases.ts';
import { PlatformMessage } from './lines.ts';
import type { PlatformLog } from './platform-log.ts';

/** One of TERMINAL_RUN_STATUSES (read from the database's definition, so a string here). */
export type TerminalStatus = string;

export interface RunPlan {
  readonly status: TerminalStatus;
  readonly durationMs: number;
  readonly subagents: number;
  /**
   * The subagents end after their root (a cancellation reaching the children late), so the
   * fence check finds an active run in the scope and defers.
   */
  readonly subagentsOutliveRoot: boolean;
}

/**
 * The demo's mix of the terminal statuses; every terminal status appears at least once when there
 * are as many runs as statuses, one the mix does not name too.
 */
const STATUS_WEIGHTS: Readonly<Record<TerminalStatus, number>> = {
  completed: 0.55,
  failed: 0.2,
  cancelled: 0.15,
  interrupted: 0.1,
};
const RUN_DURATION_MS = { min: 200, max: 1200 } as const;
const SUBAGENT_SHARE = 0.35;
/** How long an "interrupted" run goes without renewals before the platform gives up on it. */
const LEASE_LAPSE_MS = 300;
const LATE_SUBAGENT_MS = { min: 300, max: 900 } as const;
/** How often a refused admission is tried again. */
const ADMISSION_RETRY_MS = 100;

export function planRuns(count: number, random: () => number): RunPlan[] {
  const statuses: TerminalStatus[] = [];
  for (const status of TERMINAL_RUN_STATUSES) {
    const share = Math.floor((STATUS_WEIGHTS[status] ?? 0) * count);
    const times = count >= TERMINAL_RUN_STATUSES.length ? Math.max(1, share) : share;
    for (let i = 0; i < times; i += 1) statuses.push(status);
  }
  while (statuses.length < count) statuses.push('completed');
  statuses.length = count;
  shuffle(statuses, random);
  return statuses.map((status) => {
    const subagents = random() < SUBAGENT_SHARE ? 1 + Math.floor(random() * 2) : 0;
    return {
      status,
      durationMs: Math.round(RUN_DURATION_MS.min + random() * (RUN_DURATION_MS.max - RUN_DURATION_MS.min)),
      subagents,
      subagentsOutliveRoot: subagents > 0 && status === 'cancelled',
    };
  });
}

/** A sandbox a root run acquired, as the built-in provisioner reports it (for the final checks). */
export interface SandboxRecord {
  readonly runId: string;
  readonly uid: string;
  readonly runtimeScopeId: string;
  readonly sandboxId: string;
  readonly generation: number;
  readonly pid: number | undefined;
  readonly dir: string | undefined;
}

export interface WorkloadOptions {
  runs: number;
  scopes: number;
  workers: number;
  /** Every uid starts with it, so the demo's rows can be told from any others in the database. */
  uidPrefix: string;
  random: () => number;
  platform: PlatformSimulator;
  log: PlatformLog;
  /** The pid and directory of a live sandbox, when the provisioner is the built-in one. */
  describeSandbox?: (sandboxId: string) => { pid: number; dir: string } | undefined;
  /**
   * How many runs' admissions crash between creating a sandbox and recording it (the first
   * `leaks` runs of the plan, after the shuffle): each leaves one sandbox no row names, for the
   * reclaimer to find. 0 unless told.
   */
  leaks?: number;
}

/** A sandbox the platform created and never recorded (a crash between create and record). */
export interface LeakedSandbox {
  readonly runId: string;
  readonly uid: string;
  readonly runtimeScopeId: string;
  readonly sandboxId: string;
}

export class Workload {
  /** Every sandbox acquired, in order. */
  readonly sandboxes: SandboxRecord[] = [];
  /** Every sandbox leaked on purpose, in order. */
  readonly leaked: LeakedSandbox[] = [];
  readonly #options: WorkloadOptions;
  readonly #plans: RunPlan[];
  readonly #leases: LeaseWorkers;
  readonly #stop = new AbortController();
  #nextRun = 0;

  constructor(options: WorkloadOptions) {
    this.#options = options;
    this.#plans = planRuns(options.runs, options.random);
    this.#leases = new LeaseWorkers(options.workers, options.platform, options.log);
  }

  /** Runs every planned run; resolves when the last one finished, or soon after `stop`. */
  async run(): Promise<void> {
    const { scopes, runs, log } = this.#options;
    // A renewal's time includes this process's event-loop delay (the stack, the provisioner and
    // the workload share it, on a machine that also runs PostgreSQL and the sandboxes), so the
    // delay is measured too: it tells CPU contention apart from waiting for a lock.
    const loopDelay = monitorEventLoopDelay({ resolution: 10 });
    loopDelay.enable();
    this.#leases.start();
    try {
      // The first conversation that fails stops the others: a broken workload is reported, not
      // left half running.
      let failure: { error: unknown } | undefined;
      const loops = Array.from({ length: Math.min(scopes, runs) }, (_, index) =>
        this.#conversation(index).catch((error: unknown) => {
          if (!this.#stop.signal.aborted) failure ??= { error };
          this.#stop.abort();
        }),
      );
      await Promise.all(loops);
      if (failure) throw failure.error;
    } finally {
      await this.#leases.stop();
      loopDelay.disable();
    }
    if (!this.#stop.signal.aborted) {
      log(PlatformMessage.WORKLOAD_FINISHED, {
        runs,
        eventLoopDelayP99Ms: Math.round(loopDelay.percentile(99) / 1e5) / 10,
        eventLoopDelayMaxMs: Math.round(loopDelay.max / 1e5) / 10,
      });
    }
  }

  /** Stops admitting and ends the waits; runs in progress are left as they are. */
  stop(): void {
    this.#stop.abort();
  }

  async #conversation(index: number): Promise<void> {
    const { platform, uidPrefix } = this.#options;
    const signal = this.#stop.signal;
    // A few users, each with several conversations: scopes are per (uid, scope), not per user.
    const scope = await platform.createScope(`${uidPrefix}-user-${(index % 3) + 1}`);
    while (!signal.aborted) {
      const runIndex = this.#nextRun;
      if (runIndex >= this.#plans.length) return;
      this.#nextRun += 1;
      const admitted = await this.#admit(scope, runIndex);
      if (!admitted) return;
      await this.#play(admitted.run, admitted.workerId, this.#plans[runIndex]!, runIndex);
    }
  }

  /** Tries to admit the next root run until the scope's fence is cleared. */
  async #admit(
    scope: ScopeRef,
    runIndex: number,
  ): Promise<{ run: AdmittedRun; workerId: string } | undefined> {
    const { platform, log, describeSandbox } = this.#options;
    const signal = this.#stop.signal;
    const workerId = this.#leases.nextWorker();
    const started = performance.now();
    let refused = 0;
    while (!signal.aborted) {
      const crashBeforeRecording = runIndex < (this.#options.leaks ?? 0);
      const run = await platform.admitRootRun(scope, { workerId, crashBeforeRecording });
      if (run) {
        if (run.leakedSandboxId) {
          this.leaked.push({
            runId: run.runId,
            uid: scope.uid,
            runtimeScopeId: scope.runtimeScopeId,
            sandboxId: run.leakedSandboxId,
          });
          log(PlatformMessage.SANDBOX_LEAKED, {
            runId: run.runId,
            runIndex,
            uid: scope.uid,
            runtimeScopeId: scope.runtimeScopeId,
            sandboxId: run.leakedSandboxId,
          });
        }
        this.#leases.hold(workerId, run.runId);
        const sandbox = describeSandbox?.(run.sandboxId);
        this.sandboxes.push({
          runId: run.runId,
          uid: scope.uid,
          runtimeScopeId: scope.runtimeScopeId,
          sandboxId: run.sandboxId,
          generation: run.generation,
          pid: sandbox?.pid,
          dir: sandbox?.dir,
        });
        log(PlatformMessage.RUN_ADMITTED, {
          runId: run.runId,
          runIndex,
          uid: scope.uid,
          runtimeScopeId: scope.runtimeScopeId,
          workdirPath: scope.workdirPath,
          sandboxId: run.sandboxId,
          generation: run.generation,
          workerId,
          refusedAttempts: refused,
          waitedMs: Math.round(performance.now() - started),
        });
        return { run, workerId };
      }
      refused += 1;
      if (refused === 1) {
        log(PlatformMessage.ADMISSION_REFUSED, {
          runIndex,
          uid: scope.uid,
          runtimeScopeId: scope.runtimeScopeId,
        });
      }
      if (!(await pause(ADMISSION_RETRY_MS, signal))) return undefined;
    }
    return undefined;
  }

  async #play(root: AdmittedRun, workerId: string, plan: RunPlan, runIndex: number): Promise<void> {
    const { platform, log, random } = this.#options;
    const signal = this.#stop.signal;
    const subagents: string[] = [];
    for (let i = 0; i < plan.subagents; i += 1) {
      const runId = await platform.startSubagent(root);
      this.#leases.hold(workerId, runId);
      subagents.push(runId);
      log(PlatformMessage.SUBAGENT_STARTED, { runId, parentRunId: root.runId });
    }
    if (!(await pause(plan.durationMs, signal))) return;

    if (plan.status === 'interrupted') {
      // The worker is lost: nobody renews the leases, and once they lapse the platform ends the
      // runs as interrupted.
      for (const runId of [root.runId, ...subagents]) this.#leases.drop(runId);
      if (!(await pause(LEASE_LAPSE_MS, signal))) return;
    }
    // Children end the way their root does (a failed root's subagents are failed with it).
    if (!plan.subagentsOutliveRoot) await this.#finishSubagents(subagents, plan.status, root.runId);
    this.#leases.drop(root.runId);
    const fenced = await platform.finishRun(root.runId, plan.status);
    log(PlatformMessage.RUN_FINISHED, {
      runId: root.runId,
      runIndex,
      uid: root.scope.uid,
      runtimeScopeId: root.scope.runtimeScopeId,
      status: plan.status,
      fenced,
      subagents: subagents.length,
      subagentsStillRunning: plan.subagentsOutliveRoot ? subagents.length : 0,
    });
    if (plan.subagentsOutliveRoot) {
      const lateMs = LATE_SUBAGENT_MS.min + random() * (LATE_SUBAGENT_MS.max - LATE_SUBAGENT_MS.min);
      if (!(await pause(lateMs, signal))) return;
      await this.#finishSubagents(subagents, plan.status, root.runId);
    }
  }

  async #finishSubagents(runIds: string[], status: TerminalStatus, parentRunId: string): Promise<void> {
    for (const runId of runIds) {
      this.#leases.drop(runId);
      await this.#options.platform.finishRun(runId, status);
      this.#options.log(PlatformMessage.SUBAGENT_FINISHED, { runId, parentRunId, status });
    }
  }
}

/** Waits, unless stopped first; returns false when stopped. */
async function pause(ms: number, signal: AbortSignal): Promise<boolean> {
  try {
    await sleep(ms, undefined, { signal });
    return true;
  } catch {
    return false;
  }
}

function shuffle<T>(items: T[], random: () => number): void {
  for (let i = items.length - 1; i > 0; i -= 1) {
    const j = Math.floor(random() * (i + 1));
    [items[i], items[j]] = [items[j]!, items[i]!];
  }
}
