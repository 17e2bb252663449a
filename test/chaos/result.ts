/**
 * The result of a chaos run: what ran, what was injected, every invariant with how often it was
 * checked and violated, convergence, the coverage cycle, and what a post-mortem needs. Written
 * as JSON and Markdown by report.ts.
 */
import { cpus, totalmem } from 'node:os';
import type { Message } from '@aws-sdk/client-sqs';
import type { FinalVerdict } from './final-checks.ts';
import { Invariant, percentile, type Violation } from './invariants.ts';
import { runIdOf } from './message-log.ts';
import type { RunRecord } from './run-driver.ts';
import { CONVERGENCE_BOUND_MS } from './settings.ts';

export interface ChaosResult {
  seed: number;
  runs: number;
  concurrency: number;
  startedAt: string;
  durationMs: number;
  runPhaseMs: number;
  finalDrainMs: number;
  machine: Record<string, unknown>;
  config: Record<string, unknown>;
  faultsInjected: Record<string, number>;
  dbKillsByPhase: Record<string, number>;
  checks: Record<Invariant, { checked: number; violations: number }>;
  /** The coverage cycle: per forced kind, how many forced runs saw it fire, and those that did not. */
  coverage: {
    fired: Record<string, number>;
    missed: Array<{ kind: string; run: number }>;
    longestWaitMs: number;
  };
  /** Violations the periodic checks saw while the runs executed (all are also in `violations`). */
  foundDuringRun: number;
  violations: Violation[];
  convergence: {
    boundMs: number;
    samples: number;
    p50Ms: number;
    p99Ms: number;
    maxMs: number;
    /** The fences still up when their run's faults stopped: the ones convergence is really about. */
    fencedWhenFaultsStopped: { samples: number; p50Ms: number; p99Ms: number; maxMs: number };
    fenceToClearP50Ms: number;
    fenceToClearP99Ms: number;
    fenceToClearMaxMs: number;
  };
  probe: Record<string, number>;
  deadLetters: Record<string, Record<string, number>>;
  /** A few dead letters of each queue and error code, with their reason. */
  deadLetterSamples: Array<{ queue: string; errorCode: string; reason: string; runId: string | undefined }>;
  /** Runs named by a violation (their plan's fault kinds and what happened), for the post-mortem. */
  violatingRuns: RunRecord[];
  messages: Record<string, number>;
  admissions: { attempts: number; refused: number; admitted: number };
  sandboxes: { created: number; leftLiveAtEnd: number; expectedLeaks: number };
  harnessErrors: string[];
  /** Static checks the CLI adds (the SQL scan); the fixed-seed test runs them as tests. */
  security?: Record<string, unknown>;
  clock: Record<string, number>;
  stackErrors: Record<string, number>;
  /** The stack-wide episodes and operator actions of issue 11's faults, as they happened. */
  episodes?: Record<string, unknown>;
}

/** The parts of a run the result is assembled from. */
export interface ResultInputs {
  /** Reclaimer hook (issue 13): the reclaimer's DELETEs invariant GC judged (0 when off). */
  reclaimDeletesChecked?: number;
  identity: Pick<ChaosResult, 'seed' | 'runs' | 'concurrency' | 'startedAt' | 'config'>;
  timing: Pick<ChaosResult, 'durationMs' | 'runPhaseMs' | 'finalDrainMs'>;
  postgresVersion: string;
  verdict: FinalVerdict;
  runRecords: readonly RunRecord[];
  foundDuringRun: number;
  faultsInjected: ReadonlyMap<string, number>;
  dbKillsByPhase: ReadonlyMap<string, number>;
  probe: { counts: ReadonlyMap<string, number>; probed: number };
  harnessErrors: string[];
  clock: Record<string, number>;
  stackErrors: ReadonlyMap<string, number>;
  episodes?: Record<string, unknown>;
}

export function assembleResult(input: ResultInputs): ChaosResult {
  const { verdict, runRecords } = input;
  const all = verdict.violations;
  const count = (invariant: Invariant) => all.filter((violation) => violation.invariant === invariant).length;
  const counts = verdict.counts;
  const convergenceValues = verdict.convergence.samples.map((sample) => sample.convergenceMs);
  const fenceToClear = verdict.convergence.samples.map((sample) => sample.fenceToClearMs);
  const stillFenced = verdict.convergence.samples
    .filter((sample) => sample.fencedWhenFaultsStopped)
    .map((sample) => sample.convergenceMs);
  const admissions = runRecords.reduce(
    (sum, record) => ({
      attempts: sum.attempts + record.admissions.attempts,
      refused: sum.refused + record.admissions.refused,
      admitted: sum.admitted + record.admissions.admitted,
    }),
    { attempts: 0, refused: 0, admitted: 0 },
  );
  const harnessErrors = [
    ...input.harnessErrors,
    ...runRecords.flatMap((record) => record.errors.map((e) => `run ${record.index}: ${e}`)),
  ];
  return {
    ...input.identity,
    ...input.timing,
    machine: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model ?? 'unknown',
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      platform: `${process.platform}-${process.arch}`,
      postgres: input.postgresVersion,
    },
    faultsInjected: Object.fromEntries(
      [...input.faultsInjected.entries()].sort(([a], [b]) => a.localeCompare(b)),
    ),
    dbKillsByPhase: Object.fromEntries(input.dbKillsByPhase),
    checks: {
      [Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE]: {
        checked: counts.clearsChecked,
        violations: count(Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE),
      },
      // Every sandbox generation ever recorded is checked for being gone (or an expected leak).
      [Invariant.NO_SANDBOX_LEAKED]: {
        checked: verdict.sandboxesCreated,
        violations: count(Invariant.NO_SANDBOX_LEAKED),
      },
      [Invariant.ONLY_CAPTURED_GENERATION_DELETED]: {
        checked: counts.deletesChecked + counts.capturesChecked,
        violations: count(Invariant.ONLY_CAPTURED_GENERATION_DELETED),
      },
      [Invariant.NO_DELETE_UNDER_ACTIVE_RUN]: {
        checked: counts.deletionsChecked,
        violations: count(Invariant.NO_DELETE_UNDER_ACTIVE_RUN),
      },
      [Invariant.NO_LOCK_HELD_DURING_PROVISIONER_CALL]: {
        checked: input.probe.probed,
        violations: count(Invariant.NO_LOCK_HELD_DURING_PROVISIONER_CALL),
      },
      [Invariant.CONVERGENCE]: {
        checked: verdict.convergence.samples.length + verdict.convergence.uncleared.length,
        violations: count(Invariant.CONVERGENCE),
      },
      [Invariant.NOTHING_LOST]: {
        checked: verdict.nothingLost.checked,
        violations: count(Invariant.NOTHING_LOST),
      },
      [Invariant.IDS_PERCENT_ENCODED]: {
        checked: verdict.paths.checked,
        violations: count(Invariant.IDS_PERCENT_ENCODED),
      },
      // Reclaimer hook (issue 13, reclaim-chaos.ts).
      [Invariant.RECLAIM_NEVER_OWNED]: {
        checked: input.reclaimDeletesChecked ?? 0,
        violations: count(Invariant.RECLAIM_NEVER_OWNED),
      },
      ...extraChecks(verdict, count),
    } as Record<Invariant, { checked: number; violations: number }>,
    coverage: coverageOf(runRecords),
    foundDuringRun: input.foundDuringRun,
    violations: all,
    convergence: {
      boundMs: CONVERGENCE_BOUND_MS,
      samples: convergenceValues.length,
      p50Ms: percentile(convergenceValues, 50),
      p99Ms: percentile(convergenceValues, 99),
      maxMs: Math.max(0, ...convergenceValues),
      fencedWhenFaultsStopped: {
        samples: stillFenced.length,
        p50Ms: percentile(stillFenced, 50),
        p99Ms: percentile(stillFenced, 99),
        maxMs: Math.max(0, ...stillFenced),
      },
      fenceToClearP50Ms: percentile(fenceToClear, 50),
      fenceToClearP99Ms: percentile(fenceToClear, 99),
      fenceToClearMaxMs: Math.max(0, ...fenceToClear),
    },
    probe: Object.fromEntries(input.probe.counts),
    deadLetters: deadLettersByCode(verdict.deadLetters),
    deadLetterSamples: deadLetterSamples(verdict.deadLetters),
    violatingRuns: violatingRuns(runRecords, all),
    messages: verdict.nothingLost.messageCounts,
    admissions,
    sandboxes: {
      created: verdict.sandboxesCreated,
      leftLiveAtEnd: verdict.live.length,
      expectedLeaks: verdict.live.length - verdict.leaks.length,
    },
    harnessErrors,
    clock: input.clock,
    stackErrors: Object.fromEntries(input.stackErrors),
    ...(input.episodes ? { episodes: input.episodes } : {}),
  };
}

/** The invariants beyond the fixed set, each with the count its judge reported. */
function extraChecks(
  verdict: FinalVerdict,
  count: (invariant: Invariant) => number,
): Partial<Record<Invariant, { checked: number; violations: number }>> {
  return Object.fromEntries(
    Object.entries(verdict.extraChecks).map(([invariant, checked]) => [
      invariant,
      { checked: checked ?? 0, violations: count(invariant as Invariant) },
    ]),
  );
}

function deadLettersByCode(deadLetters: ReadonlyMap<string, Message[]>): ChaosResult['deadLetters'] {
  return Object.fromEntries(
    [...deadLetters.entries()].map(([queue, list]) => [
      queue,
      list.reduce<Record<string, number>>((byCode, message) => {
        const code = message.MessageAttributes?.errorCode?.StringValue ?? '(none)';
        byCode[code] = (byCode[code] ?? 0) + 1;
        return byCode;
      }, {}),
    ]),
  );
}

/** At most three dead letters per queue and error code, with their reason. */
function deadLetterSamples(deadLetters: ReadonlyMap<string, Message[]>): ChaosResult['deadLetterSamples'] {
  return [...deadLetters.entries()].flatMap(([queue, list]) => {
    const seen = new Map<string, number>();
    return list.flatMap((message) => {
      const errorCode = message.MessageAttributes?.errorCode?.StringValue ?? '(none)';
      const n = seen.get(errorCode) ?? 0;
      seen.set(errorCode, n + 1);
      if (n >= 3) return [];
      return [
        {
          queue,
          errorCode,
          reason: (message.MessageAttributes?.reason?.StringValue ?? '').slice(0, 300),
          runId: runIdOf(message.Body ?? '')?.slice(0, 80),
        },
      ];
    });
  });
}

function violatingRuns(records: readonly RunRecord[], violations: readonly Violation[]): RunRecord[] {
  return records.filter((record) =>
    violations.some((violation) =>
      record.rootRunIds.some((runId) => JSON.stringify(violation).includes(runId)),
    ),
  );
}

export function coverageOf(records: readonly RunRecord[]): ChaosResult['coverage'] {
  const fired: Record<string, number> = {};
  const missed: Array<{ kind: string; run: number }> = [];
  let longestWaitMs = 0;
  for (const record of records) {
    if (!record.forced) continue;
    longestWaitMs = Math.max(longestWaitMs, record.forced.waitedMs);
    if (record.forced.fired) fired[record.forced.kind] = (fired[record.forced.kind] ?? 0) + 1;
    else missed.push({ kind: record.forced.kind, run: record.index });
  }
  return { fired, missed, longestWaitMs };
}
