/**
 * The demo's verdict. Figures come from the captured lines (the model): counts and latencies from
 * the functions' log and EMF lines, lease renewals from the platform's lines. The pass/fail
 * checks come from the ground truth (database, provisioner, process table, file system, DLQs),
 * which the exit code follows.
 */
import { MetricName } from '../../../functions/adapters/metric-names.ts';
import { type DemoModel, hungWindows, longestLeaseWaitWhileHung, quantile } from './model.ts';
import type { GroundTruth } from './verify.ts';

export const DemoOutcome = {
  CONVERGED: 'converged',
  NOT_CONVERGED: 'not_converged',
  INTERRUPTED: 'interrupted',
  FAILED: 'failed',
} as const;
export type DemoOutcome = (typeof DemoOutcome)[keyof typeof DemoOutcome];

export const ExitCode = { OK: 0, NOT_CONVERGED: 1, USAGE: 2, INTERRUPTED: 130 } as const;

export interface Check {
  name: string;
  ok: boolean;
  detail: string;
}

export interface DeadLetterSummary {
  runId: string | null;
  queue: string;
  errorCode: string;
  reason: string;
  /** The fence of its run was cleared anyway (the sweeper re-announced it). */
  recovered: boolean;
}

export interface DemoSummary {
  outcome: DemoOutcome;
  exitCode: number;
  reasons: string[];
  checks: Check[];
  seed: number;
  faults: string;
  faultsStoppedAtSeconds: number | null;
  durationSeconds: number;
  convergedSecondsAfterLastRun: number | null;
  runs: {
    root: number;
    planned: number;
    subagents: number;
    scopes: number;
    byStatus: Record<string, number>;
  };
  fences: { set: number; clearedPerLog: number; pendingInDatabase: number };
  stillFenced: Array<{ runId: string; status: string; pendingSeconds: number; lastLine: string }>;
  sandboxes: {
    acquired: number;
    liveAtProvisioner: number;
    processesAlive: number;
    directoriesLeft: number;
    processesChecked: boolean;
  };
  /**
   * The sandboxes the workload leaked on purpose (a platform crash between create and record) and
   * what the reclaimer did with them: `stillLive` from the provisioner, `reclaimed` from the
   * reclaimer's SandboxesReclaimed metric.
   */
  leaks: { made: number; reclaimed: number; stillLive: number };
  /** After everything was stopped (also after Ctrl-C): what the demo left behind. */
  stopped: {
    sandboxProcessesLeft: number;
    sandboxDirectoriesLeft: number;
    /** Null when PostgreSQL was not the embedded one. */
    postgresStopped: boolean | null;
  };
  releases: {
    succeeded: number;
    byOutcome: Record<string, number>;
    /** ReleaseDuration (lock wait + delete) of the successful releases, from the EMF lines. */
    durationMs: { p50: number | null; max: number | null };
    failedAttempts: number;
    failuresByCode: Record<string, number>;
    hungDeletes: number;
  };
  retries: number;
  deferrals: number;
  reannouncedBySweeper: number;
  deadLetters: { count: number; inQueues: number; items: DeadLetterSummary[] };
  cleanupLatencyMs: { samples: number; p50: number | null; p99: number | null; max: number | null };
  leaseRenewals: {
    renewals: number;
    longestWaitMs: number;
    longestWaitWhileDeleteHungMs: number | null;
    roundsWhileDeleteHung: number;
    boundMs: number;
    failures: number;
    /** The platform process's own event-loop delay meanwhile: how much of a wait was CPU, not a lock. */
    eventLoopDelayMaxMs: number | null;
    eventLoopDelayP99Ms: number | null;
  };
  admissions: {
    admitted: number;
    refusedAttempts: number;
    runsThatWaited: number;
    longestWaitMs: number;
    reusedGenerations: string[];
  };
  /** EMF totals, as CloudWatch would chart them. */
  metrics: Record<string, { samples: number; sum: number }>;
  files: { log: string; timeline: string | null };
  lines: { total: number; notJson: number; aboutOtherRuns: number };
  postgres: string;
}

export interface SummaryInputs {
  model: DemoModel;
  truth: GroundTruth | undefined;
  stopped: DemoSummary['stopped'];
  interrupted: boolean;
  failure: string | undefined;
  seed: number;
  faults: string;
  plannedRuns: number;
  /** How many sandboxes the workload leaked on purpose. */
  leaksMade: number;
  scopes: number;
  startedAt: number;
  finishedAt: number;
  lastRunFinishedAt: number | undefined;
  convergedAt: number | undefined;
  deleteTimeoutMs: number;
  cleanupTimeoutMs: number;
  leaseBoundMs: number;
  deadLettersBefore: number;
  files: { log: string; timeline: string | null };
  lines: { total: number; unparsed: number };
  postgres: string;
}

export function buildSummary(input: SummaryInputs): DemoSummary {
  const { model, truth } = input;
  const runs = [...model.runs.values()];
  const fenced = model.fencedRuns();
  const byStatus: Record<string, number> = {};
  for (const run of runs) if (run.status) byStatus[run.status] = (byStatus[run.status] ?? 0) + 1;
  const failuresByCode: Record<string, number> = {};
  let failedAttempts = 0;
  let deferrals = 0;
  let reannounced = 0;
  for (const run of runs) {
    deferrals += run.deferrals.length;
    reannounced += run.reannounced;
    for (const failure of run.failures) {
      failedAttempts += 1;
      failuresByCode[failure.errorCode] = (failuresByCode[failure.errorCode] ?? 0) + 1;
    }
  }
  const windows = hungWindows(model, {
    deleteTimeoutMs: input.deleteTimeoutMs,
    cleanupTimeoutMs: input.cleanupTimeoutMs,
  });
  const whileHung = longestLeaseWaitWhileHung(model, windows);
  const latencies = model.metricValues(MetricName.CLEANUP_LATENCY);
  const releaseDurations = model.metricValues(MetricName.RELEASE_DURATION);
  const releaseOutcomes = dimensionTotals(model, MetricName.RELEASE_SUCCEEDED, 'outcome');
  const pendingIds = new Set(truth?.pendingFences.map((fence) => fence.runId) ?? []);
  const deadLetterQueues = Object.values(truth?.deadLetterQueues ?? {}).reduce(
    (sum, count) => sum + count,
    0,
  );

  const summary: DemoSummary = {
    outcome: DemoOutcome.CONVERGED,
    exitCode: ExitCode.OK,
    reasons: [],
    checks: [],
    seed: input.seed,
    faults: input.faults,
    faultsStoppedAtSeconds:
      model.faultsStoppedAt !== undefined ? round1((model.faultsStoppedAt - input.startedAt) / 1000) : null,
    durationSeconds: round1((input.finishedAt - input.startedAt) / 1000),
    convergedSecondsAfterLastRun:
      input.convergedAt !== undefined && input.lastRunFinishedAt !== undefined
        ? round1((input.convergedAt - input.lastRunFinishedAt) / 1000)
        : null,
    runs: {
      root: runs.length,
      planned: input.plannedRuns,
      subagents: model.subagents,
      scopes: Math.min(input.scopes, input.plannedRuns),
      byStatus,
    },
    fences: {
      set: fenced.length,
      clearedPerLog: fenced.filter((run) => run.clearedAt !== undefined).length,
      pendingInDatabase: truth?.pendingFences.length ?? -1,
    },
    stillFenced: (truth?.pendingFences ?? []).map((fence) => {
      const last = model.runs.get(fence.runId)?.lastLine;
      return {
        runId: fence.runId,
        status: fence.status,
        pendingSeconds: round1(fence.pendingSeconds),
        lastLine: last
          ? `${last.source}: ${last.message}${last.errorCode ? ` (${last.errorCode})` : ''}`
          : 'no function has logged anything about it yet',
      };
    }),
    sandboxes: {
      acquired: runs.length,
      liveAtProvisioner: truth?.liveSandboxes.length ?? -1,
      processesAlive: truth?.aliveProcesses.length ?? -1,
      directoriesLeft: truth?.leftoverDirectories.length ?? -1,
      processesChecked: truth?.processesChecked ?? false,
    },
    leaks: {
      made: input.leaksMade,
      reclaimed: (model.metricValues(MetricName.SANDBOXES_RECLAIMED) ?? []).reduce(
        (sum, value) => sum + value,
        0,
      ),
      stillLive: truth?.leakedStillLive.length ?? -1,
    },
    stopped: input.stopped,
    releases: {
      succeeded: Object.values(releaseOutcomes).reduce((sum, count) => sum + count, 0),
      byOutcome: releaseOutcomes,
      durationMs: {
        p50: roundOrNull(quantile(releaseDurations, 0.5)),
        max: roundOrNull(releaseDurations.length ? Math.max(...releaseDurations) : undefined),
      },
      failedAttempts,
      failuresByCode,
      hungDeletes: windows.length,
    },
    retries: failedAttempts,
    deferrals,
    reannouncedBySweeper: reannounced,
    deadLetters: {
      count: model.deadLetters.length,
      inQueues: Math.max(0, deadLetterQueues - input.deadLettersBefore),
      items: model.deadLetters.map((letter) => ({
        runId: letter.runId ?? null,
        queue: letter.queue,
        errorCode: letter.errorCode,
        reason: letter.reason,
        recovered: letter.runId !== undefined && !pendingIds.has(letter.runId) && truth !== undefined,
      })),
    },
    cleanupLatencyMs: {
      samples: latencies.length,
      p50: roundOrNull(quantile(latencies, 0.5)),
      p99: roundOrNull(quantile(latencies, 0.99)),
      max: roundOrNull(latencies.length ? Math.max(...latencies) : undefined),
    },
    leaseRenewals: {
      renewals: model.leaseRenewals,
      longestWaitMs: model.longestLeaseWait().waitMs,
      longestWaitWhileDeleteHungMs: whileHung.rounds > 0 ? whileHung.waitMs : null,
      roundsWhileDeleteHung: whileHung.rounds,
      boundMs: input.leaseBoundMs,
      failures: model.leaseFailures,
      eventLoopDelayMaxMs: model.eventLoopDelay?.maxMs ?? null,
      eventLoopDelayP99Ms: model.eventLoopDelay?.p99Ms ?? null,
    },
    admissions: {
      admitted: runs.length,
      refusedAttempts: model.refusedAdmissions,
      runsThatWaited: model.runsThatWaited,
      longestWaitMs: model.longestAdmissionWaitMs,
      reusedGenerations: truth?.reusedGenerations ?? [],
    },
    metrics: Object.fromEntries(
      [...model.metrics.entries()]
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([name, aggregate]) => [
          name,
          { samples: aggregate.values.length, sum: round1(aggregate.values.reduce((s, v) => s + v, 0)) },
        ]),
    ),
    files: input.files,
    lines: { total: input.lines.total, notJson: input.lines.unparsed, aboutOtherRuns: model.foreignLines },
    postgres: input.postgres,
  };
  summary.checks = truth ? checksOf(summary, truth) : [];
  decide(summary, input);
  return summary;
}

function checksOf(summary: DemoSummary, truth: GroundTruth): Check[] {
  const s = summary;
  const checks: Check[] = [
    {
      name: 'every fence cleared',
      ok: truth.pendingFences.length === 0,
      detail: `${s.fences.set} set, ${s.fences.set - truth.pendingFences.length} cleared in the database, ${truth.pendingFences.length} pending`,
    },
    {
      name: 'the log agrees',
      ok: s.fences.clearedPerLog === s.fences.set - truth.pendingFences.length,
      detail: `finalize logged "fence cleared" for ${s.fences.clearedPerLog} of ${s.fences.set} runs`,
    },
    {
      name: 'every sandbox deleted',
      ok: truth.liveSandboxes.length === 0,
      detail: `${s.sandboxes.acquired} acquired, ${truth.liveSandboxes.length} still live at the provisioner`,
    },
    {
      name: 'every leaked sandbox reclaimed',
      ok: truth.leakedStillLive.length === 0,
      detail: `${s.leaks.made} leaked on purpose (a crash between create and record), ${s.leaks.made - truth.leakedStillLive.length} reclaimed, ${truth.leakedStillLive.length} still live`,
    },
    {
      name: 'every run ended',
      ok: truth.nonTerminalRuns === 0 && s.runs.root === s.runs.planned,
      detail: `${s.runs.root} of ${s.runs.planned} root runs admitted, ${truth.nonTerminalRuns} runs not in a terminal status`,
    },
    {
      name: 'no run reused a live runtime',
      ok: truth.reusedGenerations.length === 0,
      detail:
        truth.reusedGenerations.length === 0
          ? 'each run of a scope got a new sandbox generation'
          : `generation reused: ${truth.reusedGenerations.slice(0, 3).join('; ')}`,
    },
    {
      name: 'lease renewals stayed short',
      ok: s.leaseRenewals.longestWaitMs < s.leaseRenewals.boundMs && s.leaseRenewals.failures === 0,
      detail: `longest ${s.leaseRenewals.longestWaitMs.toFixed(1)} ms, bound ${s.leaseRenewals.boundMs} ms${s.leaseRenewals.failures ? `, ${s.leaseRenewals.failures} failed` : ''}`,
    },
  ];
  if (truth.processesChecked) {
    checks.splice(3, 0, {
      name: 'no sandbox process or directory left',
      ok: truth.aliveProcesses.length === 0 && truth.leftoverDirectories.length === 0,
      detail: `${truth.aliveProcesses.length} processes alive, ${truth.leftoverDirectories.length} directories left`,
    });
  }
  return checks;
}

function decide(summary: DemoSummary, input: SummaryInputs): void {
  if (input.failure) summary.reasons.push(input.failure);
  if (input.interrupted) {
    summary.outcome = DemoOutcome.INTERRUPTED;
    summary.exitCode = ExitCode.INTERRUPTED;
  } else if (input.failure) {
    summary.outcome = DemoOutcome.FAILED;
    summary.exitCode = ExitCode.NOT_CONVERGED;
  }
  const { stopped } = summary;
  const leftBehind = [
    stopped.sandboxProcessesLeft > 0
      ? `${stopped.sandboxProcessesLeft} sandbox processes outlived the demo`
      : '',
    stopped.sandboxDirectoriesLeft > 0
      ? `${stopped.sandboxDirectoriesLeft} sandbox directories were left`
      : '',
    stopped.postgresStopped === false ? 'the embedded PostgreSQL is still running' : '',
  ].filter(Boolean);
  summary.reasons.push(...leftBehind);
  if (input.interrupted || input.failure) return;
  for (const check of summary.checks) if (!check.ok) summary.reasons.push(`${check.name}: ${check.detail}`);
  for (const fence of summary.stillFenced.slice(0, 10)) {
    summary.reasons.push(
      `${fence.runId} (${fence.status}) fenced for ${fence.pendingSeconds} s; last: ${fence.lastLine}`,
    );
  }
  if (summary.reasons.length > 0) {
    summary.outcome = DemoOutcome.NOT_CONVERGED;
    summary.exitCode = ExitCode.NOT_CONVERGED;
  }
}

function dimensionTotals(model: DemoModel, metric: string, dimension: string): Record<string, number> {
  const totals: Record<string, number> = {};
  for (const [label, sum] of model.metrics.get(metric)?.byDimension ?? []) {
    const [key, value] = label.split('=');
    if (key === dimension && value !== undefined) totals[value] = sum;
  }
  return totals;
}

function round1(value: number): number {
  return Math.round(value * 10) / 10;
}

function roundOrNull(value: number | undefined): number | null {
  return value === undefined ? null : Math.round(value);
}
