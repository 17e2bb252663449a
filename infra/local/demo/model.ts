/**
 * What the demo knows, folded from the captured lines alone: the platform's lines say which runs
 * exist and when they finished, the functions' log lines follow each run through the three
 * phases (they carry `runId`), and their EMF lines carry the metrics an operator would chart.
 * The progress display and the summary read this model; the database and the provisioner are
 * consulted only to cross-check the end state (verify.ts).
 */
import { ascending, nearestRank } from '../nearest-rank.ts';
import {
  FunctionMessage,
  type LogLine,
  type MetricLine,
  number,
  type ParsedLine,
  PlatformMessage,
  text,
} from './lines.ts';

/** Error codes of an attempt that ended because the delete hung until a timeout aborted it. */
export const HUNG_ERROR_CODES: ReadonlySet<string> = new Set([
  'PROVISIONER_DELETE_TIMEOUT',
  'CLEANUP_TIMEOUT',
]);

export interface FailedAttempt {
  readonly at: number;
  readonly phase: string;
  readonly errorCode: string;
  readonly retryInSeconds: number | undefined;
}

export interface DeadLetter {
  readonly at: number;
  readonly runId: string | undefined;
  readonly queue: string;
  readonly errorCode: string;
  readonly reason: string;
}

/** One root run and its cleanup, as the lines told it. */
export interface CleanupRecord {
  readonly runId: string;
  readonly runIndex: number;
  readonly uid: string;
  readonly runtimeScopeId: string;
  readonly sandboxId: string;
  readonly generation: number;
  readonly admittedAt: number;
  finishedAt?: number;
  status?: string;
  fenced?: boolean;
  releaseRequestedAt?: number;
  failures: FailedAttempt[];
  /** When the successful delete began (its end minus lock wait and delete time). */
  releaseStartedAt?: number;
  releasedAt?: number;
  releaseOutcome?: string;
  clearedAt?: number;
  /** Fence set → cleared, as finalize measured it (database clock). */
  cleanupLatencyMs?: number;
  deferrals: number[];
  deadLetters: DeadLetter[];
  reannounced: number;
  /** The last function line about this run: what to say when it did not converge. */
  lastLine?: { at: number; source: string; level: string; message: string; errorCode?: string };
}

export interface LeaseRound {
  readonly startedAt: number;
  readonly endedAt: number;
  readonly maxWaitMs: number;
}

export interface MetricAggregate {
  /** Every value seen (counts are mostly 1s; durations are kept for percentiles). */
  values: number[];
  /** `dimension=value` (dimensions other than service/stage/function) → sum. */
  byDimension: Map<string, number>;
}

export interface ProgressSnapshot {
  elapsedMs: number;
  runs: {
    total: number;
    admitted: number;
    finished: number;
    running: number;
    waitingForFence: number;
    subagents: number;
  };
  fences: { set: number; cleared: number; pending: number };
  releases: { inFlight: number; retrying: number; done: number };
  retries: number;
  failuresByCode: Record<string, number>;
  deadLetters: number;
  deferrals: number;
  leases: { renewals: number; longestWaitMs: number };
  refusedAdmissions: number;
  workloadFinished: boolean;
}

const COMMON_DIMENSIONS: ReadonlySet<string> = new Set(['service', 'stage', 'function', 'function_name']);

export class DemoModel {
  readonly runs = new Map<string, CleanupRecord>();
  readonly metrics = new Map<string, MetricAggregate>();
  readonly leaseRounds: LeaseRound[] = [];
  readonly deadLetters: DeadLetter[] = [];
  readonly errors: LogLine[] = [];
  /** 0 s of the progress display: when the workload started. */
  startedAt: number;
  readonly totalRuns: number;
  subagents = 0;
  leaseRenewals = 0;
  leaseFailures = 0;
  refusedAdmissions = 0;
  /** Runs whose scope was fenced when they first asked to be admitted. */
  runsThatWaited = 0;
  longestAdmissionWaitMs = 0;
  /** Function lines about runs this demo did not start (e.g. fences an earlier run left behind). */
  foreignLines = 0;
  workloadFinishedAt: number | undefined;
  /** The platform process's event-loop delay while the workload ran (CPU contention). */
  eventLoopDelay: { p99Ms: number; maxMs: number } | undefined;
  faultsStoppedAt: number | undefined;
  readonly #waiting = new Set<number>();
  readonly #subagentParents = new Map<string, string>();

  constructor(options: { totalRuns: number; startedAt?: number }) {
    this.totalRuns = options.totalRuns;
    this.startedAt = options.startedAt ?? Date.now();
  }

  ingest(line: ParsedLine): void {
    if (line.kind === 'metric') this.#metric(line);
    else if (line.source === 'platform') this.#platform(line);
    else this.#function(line);
  }

  /** Every value of one EMF metric seen so far. */
  metricValues(name: string): number[] {
    return this.metrics.get(name)?.values ?? [];
  }

  metricSum(name: string): number {
    return this.metricValues(name).reduce((sum, value) => sum + value, 0);
  }

  /** Root runs that finished with the fence set. */
  fencedRuns(): CleanupRecord[] {
    return [...this.runs.values()].filter((run) => run.fenced);
  }

  snapshot(now = Date.now()): ProgressSnapshot {
    let finished = 0;
    let fenced = 0;
    let cleared = 0;
    let inFlight = 0;
    let retrying = 0;
    let done = 0;
    let retries = 0;
    let deferrals = 0;
    const failuresByCode: Record<string, number> = {};
    for (const run of this.runs.values()) {
      if (run.finishedAt !== undefined) finished += 1;
      if (run.fenced) fenced += 1;
      // A fast cleanup can log "fence cleared" before the platform logged the run finished.
      if (run.fenced && run.clearedAt !== undefined) cleared += 1;
      retries += run.failures.length;
      deferrals += run.deferrals.length;
      for (const failure of run.failures) {
        failuresByCode[failure.errorCode] = (failuresByCode[failure.errorCode] ?? 0) + 1;
      }
      if (run.releasedAt !== undefined) done += 1;
      else if (run.releaseRequestedAt !== undefined && run.clearedAt === undefined) {
        const last = run.failures.at(-1);
        const backoffEnds = last ? last.at + (last.retryInSeconds ?? 0) * 1000 : 0;
        if (last && now < backoffEnds) retrying += 1;
        else inFlight += 1;
      }
    }
    return {
      elapsedMs: now - this.startedAt,
      runs: {
        total: this.totalRuns,
        admitted: this.runs.size,
        finished,
        running: this.runs.size - finished,
        waitingForFence: this.#waiting.size,
        subagents: this.subagents,
      },
      fences: { set: fenced, cleared, pending: fenced - cleared },
      releases: { inFlight, retrying, done },
      retries,
      failuresByCode,
      deadLetters: this.deadLetters.length,
      deferrals,
      leases: { renewals: this.leaseRenewals, longestWaitMs: this.longestLeaseWait().waitMs },
      refusedAdmissions: this.refusedAdmissions,
      workloadFinished: this.workloadFinishedAt !== undefined,
    };
  }

  longestLeaseWait(): { waitMs: number; at: number | undefined } {
    let longest: LeaseRound | undefined;
    for (const round of this.leaseRounds)
      if (!longest || round.maxWaitMs > longest.maxWaitMs) longest = round;
    return { waitMs: longest?.maxWaitMs ?? 0, at: longest?.endedAt };
  }

  #metric(line: MetricLine): void {
    const dimensions = Object.entries(line.dimensions).filter(([key]) => !COMMON_DIMENSIONS.has(key));
    for (const [name, values] of Object.entries(line.values)) {
      let aggregate = this.metrics.get(name);
      if (!aggregate) {
        aggregate = { values: [], byDimension: new Map() };
        this.metrics.set(name, aggregate);
      }
      aggregate.values.push(...values);
      const sum = values.reduce((total, value) => total + value, 0);
      for (const [key, value] of dimensions) {
        const label = `${key}=${value}`;
        aggregate.byDimension.set(label, (aggregate.byDimension.get(label) ?? 0) + sum);
      }
    }
  }

  #platform(line: LogLine): void {
    const { fields } = line;
    const runIndex = number(fields, 'runIndex');
    switch (line.message) {
      case PlatformMessage.RUN_ADMITTED: {
        const runId = text(fields, 'runId');
        if (!runId) return;
        if (runIndex !== undefined && this.#waiting.delete(runIndex)) this.runsThatWaited += 1;
        this.refusedAdmissions += number(fields, 'refusedAttempts') ?? 0;
        this.longestAdmissionWaitMs = Math.max(this.longestAdmissionWaitMs, number(fields, 'waitedMs') ?? 0);
        this.runs.set(runId, {
          runId,
          runIndex: runIndex ?? this.runs.size,
          uid: text(fields, 'uid') ?? '',
          runtimeScopeId: text(fields, 'runtimeScopeId') ?? '',
          sandboxId: text(fields, 'sandboxId') ?? '',
          generation: number(fields, 'generation') ?? 0,
          admittedAt: line.at,
          failures: [],
          deferrals: [],
          deadLetters: [],
          reannounced: 0,
        });
        return;
      }
      case PlatformMessage.ADMISSION_REFUSED:
        if (runIndex !== undefined) this.#waiting.add(runIndex);
        return;
      case PlatformMessage.SUBAGENT_STARTED: {
        const runId = text(fields, 'runId');
        const parent = text(fields, 'parentRunId');
        if (runId && parent) this.#subagentParents.set(runId, parent);
        this.subagents += 1;
        return;
      }
      case PlatformMessage.RUN_FINISHED: {
        const run = this.runs.get(text(fields, 'runId') ?? '');
        if (!run) return;
        run.finishedAt = line.at;
        run.status = text(fields, 'status');
        run.fenced = fields.fenced === true;
        return;
      }
      case PlatformMessage.LEASE_ROUND: {
        if (text(fields, 'error')) {
          this.leaseFailures += 1;
          return;
        }
        const renewals = number(fields, 'renewals') ?? 0;
        const maxWaitMs = number(fields, 'maxWaitMs') ?? 0;
        const roundMs = number(fields, 'roundMs') ?? 0;
        this.leaseRenewals += renewals;
        this.leaseRounds.push({ startedAt: line.at - roundMs, endedAt: line.at, maxWaitMs });
        return;
      }
      case PlatformMessage.WORKLOAD_FINISHED:
        this.workloadFinishedAt = line.at;
        this.eventLoopDelay = {
          p99Ms: number(fields, 'eventLoopDelayP99Ms') ?? 0,
          maxMs: number(fields, 'eventLoopDelayMaxMs') ?? 0,
        };
        return;
      case PlatformMessage.FAULTS_STOPPED:
        this.faultsStoppedAt = line.at;
        return;
      default:
        if (line.level === 'ERROR') this.errors.push(line);
    }
  }

  #function(line: LogLine): void {
    const { fields } = line;
    if (line.message === FunctionMessage.SWEEP_FINISHED) {
      const ids = Array.isArray(fields.reannouncedRunIds) ? fields.reannouncedRunIds : [];
      for (const id of ids) {
        const run = typeof id === 'string' ? this.runs.get(id) : undefined;
        if (run) run.reannounced += 1;
      }
      return;
    }
    if (line.message === FunctionMessage.DEAD_LETTERED) {
      const runId = text(fields, 'runId');
      const deadLetter: DeadLetter = {
        at: line.at,
        runId,
        queue: text(fields, 'queue') ?? 'unknown',
        errorCode: text(fields, 'errorCode') ?? 'UNKNOWN',
        reason: text(fields, 'reason') ?? '',
      };
      this.deadLetters.push(deadLetter);
      this.runs.get(runId ?? '')?.deadLetters.push(deadLetter);
      return;
    }
    const runId = text(fields, 'runId');
    const run = runId ? this.runs.get(runId) : undefined;
    if (!run) {
      if (runId && !this.#subagentParents.has(runId)) this.foreignLines += 1;
      if (line.level === 'ERROR') this.errors.push(line);
      return;
    }
    const errorCode = text(fields, 'errorCode');
    run.lastLine = {
      at: line.at,
      source: line.source,
      level: line.level,
      message: line.message,
      ...(errorCode ? { errorCode } : {}),
    };
    switch (line.message) {
      case FunctionMessage.RELEASE_REQUESTED:
      case FunctionMessage.NOTHING_TO_DELETE:
        run.releaseRequestedAt ??= line.at;
        return;
      case FunctionMessage.FENCE_CHECK_DEFERRED:
      case FunctionMessage.FINALIZE_DEFERRED:
        run.deferrals.push(line.at);
        return;
      case FunctionMessage.ATTEMPT_FAILED:
        run.failures.push({
          at: line.at,
          phase: text(fields, 'phase') ?? line.source,
          errorCode: errorCode ?? 'UNKNOWN',
          retryInSeconds: number(fields, 'retryInSeconds'),
        });
        return;
      case FunctionMessage.SANDBOX_RELEASED: {
        const spentMs = (number(fields, 'lockWaitMs') ?? 0) + (number(fields, 'deleteMs') ?? 0);
        run.releasedAt = line.at;
        run.releaseStartedAt = line.at - spentMs;
        run.releaseOutcome = text(fields, 'outcome');
        return;
      }
      case FunctionMessage.FENCE_CLEARED:
        run.clearedAt = line.at;
        run.cleanupLatencyMs = number(fields, 'cleanupLatencyMs');
        run.releaseOutcome ??= text(fields, 'releaseOutcome');
        return;
      case FunctionMessage.FENCE_ALREADY_CLEAR:
        run.clearedAt ??= line.at;
        return;
    }
  }
}

/** The q-quantile (0..1) by nearest rank; undefined for no values. */
export function quantile(values: readonly number[], q: number): number | undefined {
  return nearestRank(ascending(values), q * 100);
}

/**
 * Time windows in which a delete was hanging: each attempt that ended with a hang error code
 * had hung for the timeout that ended it.
 */
export function hungWindows(
  model: DemoModel,
  timeouts: { deleteTimeoutMs: number; cleanupTimeoutMs: number },
): Array<{ from: number; to: number; runId: string }> {
  const windows: Array<{ from: number; to: number; runId: string }> = [];
  for (const run of model.runs.values()) {
    for (const failure of run.failures) {
      if (!HUNG_ERROR_CODES.has(failure.errorCode)) continue;
      const spanMs =
        failure.errorCode === 'CLEANUP_TIMEOUT' ? timeouts.cleanupTimeoutMs : timeouts.deleteTimeoutMs;
      windows.push({ from: failure.at - spanMs, to: failure.at, runId: run.runId });
    }
  }
  return windows;
}

/** The longest lease renewal among rounds that overlapped a hung delete. */
export function longestLeaseWaitWhileHung(
  model: DemoModel,
  windows: ReadonlyArray<{ from: number; to: number }>,
): { waitMs: number; rounds: number } {
  let waitMs = 0;
  let rounds = 0;
  for (const round of model.leaseRounds) {
    if (!windows.some((window) => round.startedAt <= window.to && round.endedAt >= window.from)) continue;
    rounds += 1;
    waitMs = Math.max(waitMs, round.maxWaitMs);
  }
  return { waitMs, rounds };
}
