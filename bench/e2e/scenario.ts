/**
 * Part 2: end to end through the local stack (`startStack`, in this process: SQS emulator, the
 * three functions behind emulated event source mappings, the built-in provisioner), against a
 * fresh database through the same bridge as Part 1.
 *
 * For each delete latency, two sub-runs on freshly admitted runs with live sandboxes:
 * - paced: runs announced on `run-finished` one at a time at a steady rate well below capacity,
 *   so each cleanup's latency is its own and not time spent queueing behind the others;
 * - burst: every run announced at once (10 per SendMessageBatch), for cleanups per second.
 *
 * Latency of one cleanup: from just before its run-finished send to the SentTimestamp of its
 * runtime-cleaned event (published by finalize after the fence-clearing commit). The delete's own
 * duration comes from the provisioner's audit (arrival → answer of the DELETE that deleted the
 * generation, the injected latency included); overhead = latency − delete duration.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  DeleteMessageBatchCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { Database } from '../../functions/adapters/database.ts';
import {
  createQueues,
  createSqsClient,
  deadLetterQueueName,
  FUNCTION_DEFINITIONS,
  QueueName,
} from '../../functions/adapters/queues.ts';
import { type AdmittedRun, PlatformSimulator, type ScopeRef } from '../../infra/local/platform.ts';
import { type Stack, startStack } from '../../infra/local/stack.ts';
import { type ChildHandle, startChild } from '../support/child-process.ts';
import { admitAndFinish, assertConverged, describeError } from '../support/convergence.ts';
import { type CpuReport, startCpuProbe } from '../support/cpu.ts';
import {
  type MemoryGrowth,
  type MemorySample,
  type MemoryWave,
  memoryGrowth,
  sampleAfterGc,
} from '../support/memory.ts';
import { observedTransact } from '../support/observed-transactions.ts';
import { BENCH_DATABASE_DRIVER, warmPool } from '../support/pools.ts';
import type { BenchPostgres } from '../support/postgres.ts';
import { deletesByGeneration, waitForSandboxesReady } from '../support/sandboxes.ts';
import { type Summary, summarize } from '../support/stats.ts';
import type { WindowProfiler } from '../support/window-profiler.ts';
import { swallowEmfLines } from './emf-sink.ts';
import { type Floor, type LockHold, startFloor } from './floor.ts';
import { medianBurst } from './median-burst.ts';
import { countSqsCalls, difference } from './sqs-call-counter.ts';

export interface E2eProfile {
  deleteLatenciesMs: readonly number[];
  pacedRuns: number;
  pacedPerSecond: number;
  burstRuns: number;
  /** Bursts per design and delete latency, interleaved; the median one is reported (odd; absent: 1). */
  burstRepeats?: number;
  /** Cleanups of the memory run at delete latency 0: bursts of `burstRuns`, one after the other. */
  memoryCleanups: number;
}

export interface PerCleanup {
  dbRoundTrips: number;
  dbTransactions: number;
  /** SQS calls made by the functions themselves (`Queues.stats.calls`): the sends. */
  functionSqsCalls: number;
  /** Every call of the stack's SQS client, event sources' receives and deletes included. */
  sqsCallsByCommand: Record<string, number>;
  allSqsCalls: number;
  /** CloudWatch EMF lines the functions wrote. */
  metricLines: number;
}

export interface SubRunFigure {
  runs: number;
  seconds: number;
  cleanupsPerSecond: number;
  latencyMs: Summary;
  deleteMs: Summary;
  overheadMs: Summary;
  /** Announce → the DELETE reaching the provisioner: fence-check and the release hop. */
  beforeDeleteMs: Summary;
  /** The DELETE answered → runtime-cleaned published: the finalize hop. */
  afterDeleteMs: Summary;
  perCleanup: PerCleanup;
  cpu: CpuReport;
  duplicateCleanedEvents: number;
  /** CPU of this process per cleanup, in ms. */
  cpuMsPerCleanup: number;
  /** Each one-round-trip transaction's round trip on its connection, as this process saw it. */
  lockHoldMs: Summary;
  /**
   * Each one-round-trip transaction's lock hold on the server's clock: from when the decision took
   * the scope's advisory lock to just after its COMMIT (noted: bench/support/instrumented-functions.ts). Absent in results written
   * before it was measured.
   */
  serverLockHoldMs?: Summary;
  /**
   * Paced runs only: from the announcement (the run just became terminal) to the next run of the
   * same scope admitted by the platform on receipt of runtime-cleaned; and that minus the delete.
   */
  turnaroundMs?: Summary;
  turnaroundBeyondDeleteMs?: Summary;
}

/** The project's figure over the floor's, measured in the same run (lower is better but cleanups/s). */
export interface FloorRatios {
  cpuPerCleanup?: number;
  sqsCallsPerCleanup?: number;
  dbRoundTripsPerCleanup?: number;
  burstCleanupsPerSecond?: number;
  lockHoldP99?: number;
}

export interface E2eFigure {
  deleteLatencyMs: number;
  valid: boolean;
  error?: string;
  paced?: SubRunFigure & { perSecond: number };
  /** The median burst (by cleanups/s) of `burstRepeats`. */
  burst?: SubRunFigure;
  /** Cleanups/s of every burst, project's and floor's, in the order they ran (absent in older results). */
  burstRepeats?: {
    project: number[];
    floor: number[];
    /** CPU per cleanup of every burst, in the same order (the ratio uses the median bursts'). */
    projectCpuMsPerCleanup?: number[];
    floorCpuMsPerCleanup?: number[];
  };
  /** The same sub-runs through the floor (floor.ts). */
  floor?: { paced: SubRunFigure; burst: SubRunFigure };
  /** Project ÷ floor: CPU, SQS calls and round trips per cleanup (burst), cleanups/s, lock hold p99 (paced). */
  ratios?: FloorRatios;
}

export interface MemoryRun {
  cleanups: number;
  waves: number;
  rssStartMiB: number;
  rssPeakMiB: number;
  rssEndMiB: number;
  heapUsedStartMiB: number;
  heapUsedPeakMiB: number;
  /** After a forced full GC just before the first wave (absent in results written before it was measured). */
  startAfterGc?: MemorySample;
  /** Each wave, in order (absent in results written before it was measured). */
  perWave?: MemoryWave[];
  /** Growth per cleanup of the post-GC figures over the second half of the waves (absent likewise). */
  growth?: MemoryGrowth;
}

export interface E2eReport {
  /** Pollers per queue, the stack's and the floor's alike. */
  stackConcurrency: Record<string, number>;
  /** Records per invocation at the floor's three hops: the stack's batch sizes (absent in older results). */
  floorBatchSizes?: readonly [number, number, number];
  /** Where the SQS emulator ran: in the stack's process (the default, as `npm run stack`) or its own. */
  sqsEmulator: 'in-process' | 'own-process';
  figures: E2eFigure[];
  memory?: MemoryRun;
}

export interface E2eContext {
  postgres: BenchPostgres;
  profile: E2eProfile;
  log: (line: string) => void;
  /** Run the SQS emulator in its own process instead of the stack's (see sqs-emulator-process.ts). */
  sqsInOwnProcess?: boolean;
  /** Pollers per consumed queue; the stack's defaults when omitted. */
  concurrency?: Partial<StackConcurrency>;
  /** Profiles the measured window of each burst (`--cpu-prof`). */
  profiler?: WindowProfiler;
}

export type StackConcurrency = Record<'fenceCheck' | 'release' | 'finalize', number>;

/** The stack's database pool size (infra/local/stack.ts, `maxConnections: 20`), warmed before each sub-run. */
const STACK_DB_CONNECTIONS = 20;
/**
 * The pollers per queue this benchmark gives the stack and the floor alike (`--concurrency` changes
 * them); `npm run stack` on its own runs 4 / 16 / 4 (infra/local/stack.ts).
 */
export const DEFAULT_STACK_CONCURRENCY: StackConcurrency = { fenceCheck: 4, release: 8, finalize: 4 };
const COLLECT_TIMEOUT_MS = 120_000;
/**
 * Requests the stack's provisioner keeps in its audit, per run of the largest sub-run. A sub-run
 * reads only its own requests (a POST and a DELETE per run), so five sub-runs' worth is plenty;
 * at the default 10 000 the audit would still be filling during the memory run (about 0.6 KiB
 * per cleanup) and show as growth that no deployed function has.
 */
const AUDIT_ENTRIES_PER_RUN = 10;

export async function runE2eScenario(context: E2eContext): Promise<E2eReport> {
  const { postgres, profile, log } = context;
  const database = await postgres.createDatabase('e2e');
  const dataDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-bench-stack-'));
  const stackErrors: string[] = [];
  let stack: Stack | undefined;
  let benchSqs: SQSClient | undefined;
  let floor: Floor | undefined;
  let emulator: ChildHandle<{ endpoint: string }> | undefined;
  const sqsEmulator = context.sqsInOwnProcess ? 'own-process' : 'in-process';
  const concurrency = { ...DEFAULT_STACK_CONCURRENCY, ...context.concurrency };
  const emf = swallowEmfLines();
  try {
    if (context.sqsInOwnProcess) {
      emulator = await startChild<{ endpoint: string }>(
        new URL('../support/sqs-emulator-process.ts', import.meta.url),
      );
    }
    stack = await startStack({
      // Only contract defaults (and the emulator's endpoint, if it runs apart): nothing from the
      // caller's shell (e.g. AWS_ENDPOINT_URL_SQS) leaks in.
      env: {
        DATABASE_DRIVER: BENCH_DATABASE_DRIVER,
        ...(emulator ? { AWS_ENDPOINT_URL_SQS: emulator.ready.endpoint } : {}),
      },
      databaseUrl: database.url,
      wsProxy: postgres.wsProxy,
      sqsPort: 0,
      dataDir,
      logLevel: 'SILENT',
      sweeper: false,
      provisionerGraceMs: 500,
      provisionerAuditLimit: AUDIT_ENTRIES_PER_RUN * Math.max(profile.burstRuns, profile.pacedRuns, 10),
      concurrency,
      onError: (error, source) => stackErrors.push(`${source}: ${describeError(error)}`),
    });
    const counter = countSqsCalls(stack.sqs);
    // The platform's own calls go through another client, so the counts above are the stack's only.
    benchSqs = createSqsClient({ endpoint: stack.sqsEndpoint });
    const benchQueues = createQueues({ client: benchSqs });
    const platformDb = await database.open({ maxConnections: 8 });
    await warmPool(platformDb, 8);
    const platform = new PlatformSimulator(platformDb, benchQueues, stack.provisionerUrl);
    // The functions share the stack's one Database object: observing its one-trip transactions
    // here times every lock hold of the protocol (fence check, release guard, finalize).
    const projectHolds: LockHold[] = [];
    stack.db.transact = observedTransact(stack.db, (timing) => projectHolds.push(timing));
    const floorDb = await database.open({ maxConnections: STACK_DB_CONNECTIONS });
    const floorBatchSizes = [
      FUNCTION_DEFINITIONS.fenceCheck.batchSize,
      FUNCTION_DEFINITIONS.release.batchSize,
      FUNCTION_DEFINITIONS.finalize.batchSize,
    ] as const;
    floor = await startFloor({
      sqsEndpoint: stack.sqsEndpoint,
      db: floorDb,
      provisionerUrl: stack.provisionerUrl,
      concurrency: [concurrency.fenceCheck, concurrency.release, concurrency.finalize],
      batchSizes: floorBatchSizes,
    });
    const common = {
      benchSqs,
      platform,
      platformDb,
      stackErrors,
      databaseName: database.name,
      bridgePid: postgres.bridgePid,
      provisioner: stack.provisioner!,
    };
    const stackRef = stack;
    const subRun = buildSubRun({
      ...common,
      announceUrl: stack.createdQueues.get(QueueName.RUN_FINISHED)!.url,
      cleanedUrl: stack.createdQueues.get(QueueName.RUNTIME_CLEANED)!.url,
      db: stack.db,
      counters: () => ({
        db: { ...stackRef.db.stats },
        queueCalls: stackRef.queues.stats.calls,
        sqs: counter.snapshot(),
        metricLines: emf.lines(),
      }),
      takeLockHolds: () => projectHolds.splice(0),
      assertClean: () => assertNoDeadLetters(stackRef),
      label: 'project',
      ...(context.profiler ? { profiler: context.profiler } : {}),
    });
    const floorRef = floor;
    const floorRun = buildSubRun({
      ...common,
      announceUrl: floor.startUrl,
      cleanedUrl: floor.doneUrl,
      db: floorDb,
      counters: () => ({
        db: { ...floorDb.stats },
        queueCalls: 0,
        sqs: floorRef.sqsCalls(),
        metricLines: 0,
      }),
      takeLockHolds: () => floorRef.takeLockHolds(),
      assertClean: async () => {},
      label: 'floor',
      ...(context.profiler ? { profiler: context.profiler } : {}),
    });

    // Warm-up (not reported): connections, JIT, the queues' URL caches.
    try {
      await subRun({ kind: 'paced', runs: 10, perSecond: 20, deleteLatencyMs: 0 });
      await floorRun({ kind: 'paced', runs: 10, perSecond: 20, deleteLatencyMs: 0 });
    } catch (error) {
      log(`  e2e warm-up: INVALID — ${describeError(error)}`);
      const failed = (deleteLatencyMs: number): E2eFigure => ({
        deleteLatencyMs,
        valid: false,
        error: `warm-up failed: ${describeError(error)}`,
      });
      return {
        stackConcurrency: concurrency,
        sqsEmulator,
        figures: profile.deleteLatenciesMs.map(failed),
      };
    }

    const figures: E2eFigure[] = [];
    for (const deleteLatencyMs of profile.deleteLatenciesMs) {
      try {
        const paced = await subRun({
          kind: 'paced',
          runs: profile.pacedRuns,
          perSecond: profile.pacedPerSecond,
          deleteLatencyMs,
        });
        log(
          `  e2e delete ${deleteLatencyMs} ms paced: latency p50 ${paced.latencyMs.p50} ms, overhead p50 ${paced.overheadMs.p50} / p99 ${paced.overheadMs.p99} ms`,
        );
        const floorPaced = await floorRun({
          kind: 'paced',
          runs: profile.pacedRuns,
          perSecond: profile.pacedPerSecond,
          deleteLatencyMs,
        });
        // Bursts interleaved, the order alternating, so that neither design always runs on the
        // warmer (or the more fragmented) process; the median of each stands for it.
        const projectBursts: SubRunFigure[] = [];
        const floorBursts: SubRunFigure[] = [];
        const repeats = profile.burstRepeats ?? 1;
        for (let repeat = 0; repeat < repeats; repeat += 1) {
          const burstOf = {
            kind: 'burst',
            runs: profile.burstRuns,
            deleteLatencyMs,
            tag: `${repeat + 1}-of-${repeats}`,
          } as const;
          if (repeat % 2 === 0) {
            projectBursts.push(await subRun(burstOf));
            floorBursts.push(await floorRun(burstOf));
          } else {
            floorBursts.push(await floorRun(burstOf));
            projectBursts.push(await subRun(burstOf));
          }
        }
        const burst = medianBurst(projectBursts);
        const floorBurst = medianBurst(floorBursts);
        const burstRepeats = {
          project: projectBursts.map((figure) => figure.cleanupsPerSecond),
          floor: floorBursts.map((figure) => figure.cleanupsPerSecond),
          projectCpuMsPerCleanup: projectBursts.map((figure) => figure.cpuMsPerCleanup),
          floorCpuMsPerCleanup: floorBursts.map((figure) => figure.cpuMsPerCleanup),
        };
        log(
          `  e2e delete ${deleteLatencyMs} ms bursts, cleanups/s: project ${burstRepeats.project.join(' ')} (median ${burst.cleanupsPerSecond}), floor ${burstRepeats.floor.join(' ')} (median ${floorBurst.cleanupsPerSecond})`,
        );
        const ratios = floorRatios({ paced, burst }, { paced: floorPaced, burst: floorBurst });
        log(
          `  e2e delete ${deleteLatencyMs} ms floor: ${floorBurst.cleanupsPerSecond} cleanups/s; project ÷ floor: CPU ×${ratios.cpuPerCleanup}, SQS calls ×${ratios.sqsCallsPerCleanup}, round trips ×${ratios.dbRoundTripsPerCleanup}, cleanups/s ×${ratios.burstCleanupsPerSecond}, lock hold p99 ×${ratios.lockHoldP99}`,
        );
        figures.push({
          deleteLatencyMs,
          valid: true,
          paced: { ...paced, perSecond: profile.pacedPerSecond },
          burst,
          burstRepeats,
          floor: { paced: floorPaced, burst: floorBurst },
          ratios,
        });
      } catch (error) {
        log(`  e2e delete ${deleteLatencyMs} ms: INVALID — ${describeError(error)}`);
        figures.push({ deleteLatencyMs, valid: false, error: describeError(error) });
      }
    }
    let memory: MemoryRun | undefined;
    try {
      memory = await memoryRun(subRun, profile);
      const afterGc = memory.perWave?.map((wave) => wave.afterGc) ?? [];
      const growth = memory.growth;
      log(
        `  e2e memory over ${memory.cleanups} cleanups: RSS ${memory.rssStartMiB} → peak ${memory.rssPeakMiB} → end ${memory.rssEndMiB} MiB; ` +
          `after GC, per burst: RSS ${afterGc.map((s) => s.rssMiB).join(' ')} MiB, JS heap used ${afterGc.map((s) => s.heapUsedMiB).join(' ')} MiB` +
          (growth
            ? `; growth from burst ${growth.fromWave}: JS heap ${growth.heapUsedKiBPerCleanup ?? '—'}, RSS ${growth.rssKiBPerCleanup ?? '—'} KiB per cleanup`
            : ''),
      );
    } catch (error) {
      log(`  e2e memory run: INVALID — ${describeError(error)}`);
    }
    return {
      stackConcurrency: concurrency,
      floorBatchSizes,
      sqsEmulator,
      figures,
      ...(memory ? { memory } : {}),
    };
  } finally {
    await floor?.stop();
    emf.restore();
    benchSqs?.destroy();
    await stack?.stop();
    await emulator?.stop();
    await rm(dataDir, { recursive: true, force: true });
    await database.drop();
  }
}

interface Counters {
  db: { queries: number; transactions: number };
  queueCalls: number;
  sqs: Record<string, number>;
  metricLines: number;
}

interface SubRunParts {
  benchSqs: SQSClient;
  platform: PlatformSimulator;
  platformDb: Database;
  stackErrors: string[];
  databaseName: string;
  bridgePid: number;
  provisioner: NonNullable<Stack['provisioner']>;
  /** Where a finished run is announced, and where its cleaned event appears. */
  announceUrl: string;
  cleanedUrl: string;
  /** The pool whose stats count the round trips (the stack's, or the floor's). */
  db: Database;
  counters: () => Counters;
  takeLockHolds: () => LockHold[];
  assertClean: () => Promise<void>;
  /** Names the profile of a burst's measured window (`project` or `floor`). */
  label: string;
  profiler?: WindowProfiler;
}

type SubRunRequest =
  | { kind: 'paced'; runs: number; perSecond: number; deleteLatencyMs: number }
  | {
      kind: 'burst';
      runs: number;
      deleteLatencyMs: number;
      /** Names this burst's CPU profile (`--cpu-prof`), so that repeated bursts do not overwrite each other. */
      tag: string;
    };

type SubRun = (request: SubRunRequest) => Promise<SubRunFigure>;

/**
 * The next run of the scope, admitted the way the platform admits (scope lock, then an INSERT
 * guarded by runtime_cleanup_blocked), tried again every 2 ms while the scope reads blocked.
 * Returns the wall-clock moment it was admitted.
 */
const ADMIT_NEXT = `
  INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, run_type, status)
  SELECT $1::text, $2::text, $3::bigint, $4::text, $5::text, 'chat', 'running'
  WHERE NOT runtime_cleanup_blocked($2::text, $5::text)
  RETURNING id`;

async function admitNext(db: Database, run: AdmittedRun): Promise<number> {
  const { scope } = run;
  for (let attempt = 0; attempt < 5_000; attempt += 1) {
    const admitted = await db.withTransaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
        scope.uid,
        scope.runtimeScopeId,
      ]);
      const { rows } = await tx.query(ADMIT_NEXT, [
        `${run.runId}-next`,
        scope.uid,
        scope.conversationId,
        scope.threadId,
        scope.runtimeScopeId,
      ]);
      return rows.length === 1;
    });
    if (admitted) return wallClockMs();
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  throw new Error(`the scope of ${run.runId} stayed blocked after its runtime-cleaned event`);
}

function buildSubRun(parts: SubRunParts): SubRun {
  const { benchSqs, platform, platformDb, stackErrors, provisioner } = parts;

  return async (request: SubRunRequest): Promise<SubRunFigure> => {
    const scopes: ScopeRef[] = [];
    for (let i = 0; i < request.runs; i += 1) scopes.push(await platform.createScope(`bench-user-${i % 16}`));
    const runs = await admitAndFinish(platform, scopes);
    await waitForSandboxesReady(
      provisioner,
      runs.map((run) => run.sandboxId),
    );
    await warmPool(parts.db, STACK_DB_CONNECTIONS);
    provisioner.clearFaults();
    if (request.deleteLatencyMs > 0) provisioner.setFault('*', { latencyMs: request.deleteLatencyMs });
    const errorsBefore = stackErrors.length;
    const before = parts.counters();
    parts.takeLockHolds();
    const byRunId = new Map(runs.map((run) => [run.runId, run]));
    const admittedAt = new Map<string, number>();
    const admissions: Promise<void>[] = [];
    const onCleaned =
      request.kind === 'paced'
        ? (runId: string) => {
            admissions.push(
              admitNext(platformDb, byRunId.get(runId)!).then((at) => {
                admittedAt.set(runId, at);
              }),
            );
          }
        : undefined;
    let after: Counters;
    let cleaned: Awaited<CleanedEvents['finished']>;
    let announcedAt = new Map<string, number>();
    let seconds: number;
    let cpuReport: CpuReport;
    let holds: LockHold[];
    try {
      const cpu = await startCpuProbe({ bridgePid: parts.bridgePid, databaseName: parts.databaseName });
      const started = performance.now();
      const collector = collectCleaned(benchSqs, parts.cleanedUrl, new Set(byRunId.keys()), onCleaned);
      const measured = async () => {
        announcedAt =
          request.kind === 'paced'
            ? await announcePaced(benchSqs, parts.announceUrl, runs, request.perSecond)
            : await announceBurst(benchSqs, parts.announceUrl, runs);
        await collector.complete;
      };
      if (parts.profiler && request.kind === 'burst') {
        await parts.profiler.around(
          `${parts.label}-burst-${request.deleteLatencyMs}ms-${runs.length}-${request.tag}`,
          measured,
        );
      } else {
        await measured();
      }
      seconds = (performance.now() - started) / 1000;
      after = parts.counters();
      holds = parts.takeLockHolds();
      cpuReport = await cpu.stop();
      cleaned = await collector.finished;
      await Promise.all(admissions);
    } finally {
      provisioner.clearFaults();
    }

    if (stackErrors.length > errorsBefore) {
      throw new Error(
        `the stack reported ${stackErrors.length - errorsBefore} errors, e.g. ${stackErrors[errorsBefore]}`,
      );
    }
    await assertConverged(platformDb, provisioner, runs);
    await parts.assertClean();

    const deletes = deletesByGeneration(provisioner.audit());
    const latency: number[] = [];
    const deleteMs: number[] = [];
    const overhead: number[] = [];
    const beforeDelete: number[] = [];
    const afterDelete: number[] = [];
    const turnaround: number[] = [];
    const turnaroundBeyondDelete: number[] = [];
    for (const run of runs) {
      const announced = announcedAt.get(run.runId)!;
      const event = cleaned.sentAt.get(run.runId)!;
      const audit = deletes.get(`${run.sandboxId}#${run.generation}`)!;
      const deleteDuration = audit.endedAt! - audit.startedAt;
      latency.push(event - announced);
      deleteMs.push(deleteDuration);
      overhead.push(event - announced - deleteDuration);
      beforeDelete.push(audit.startedAt - announced);
      afterDelete.push(event - audit.endedAt!);
      const admitted = admittedAt.get(run.runId);
      if (admitted !== undefined) {
        turnaround.push(admitted - announced);
        turnaroundBeyondDelete.push(admitted - announced - deleteDuration);
      }
    }
    const firstAnnounce = Math.min(...announcedAt.values());
    const lastCleaned = Math.max(...cleaned.sentAt.values());
    const sqsCalls = difference(after.sqs, before.sqs);
    const perRun = (value: number) => Math.round((value / runs.length) * 100) / 100;
    return {
      runs: runs.length,
      seconds: Math.round(seconds * 1000) / 1000,
      cleanupsPerSecond: Math.round((runs.length / ((lastCleaned - firstAnnounce) / 1000)) * 10) / 10,
      latencyMs: summarize(latency),
      deleteMs: summarize(deleteMs),
      overheadMs: summarize(overhead),
      beforeDeleteMs: summarize(beforeDelete),
      afterDeleteMs: summarize(afterDelete),
      perCleanup: {
        dbRoundTrips: perRun(after.db.queries - before.db.queries),
        dbTransactions: perRun(after.db.transactions - before.db.transactions),
        functionSqsCalls: perRun(after.queueCalls - before.queueCalls),
        sqsCallsByCommand: Object.fromEntries(
          Object.entries(sqsCalls).map(([name, count]) => [name, perRun(count)]),
        ),
        allSqsCalls: perRun(Object.values(sqsCalls).reduce((sum, count) => sum + count, 0)),
        metricLines: perRun(after.metricLines - before.metricLines),
      },
      cpu: cpuReport,
      duplicateCleanedEvents: cleaned.duplicates,
      cpuMsPerCleanup:
        Math.round(((cpuReport.seconds * cpuReport.cores.benchProcess * 1000) / runs.length) * 100) / 100,
      lockHoldMs: summarize(holds.map((hold) => hold.roundTripMs)),
      serverLockHoldMs: summarize(
        holds.flatMap((hold) => (hold.lockHeldMs === null ? [] : [hold.lockHeldMs])),
      ),
      ...(turnaround.length
        ? { turnaroundMs: summarize(turnaround), turnaroundBeyondDeleteMs: summarize(turnaroundBeyondDelete) }
        : {}),
    };
  };
}

function floorRatios(
  project: { paced: SubRunFigure; burst: SubRunFigure },
  floor: { paced: SubRunFigure; burst: SubRunFigure },
): FloorRatios {
  const over = (a: number | undefined, b: number | undefined) =>
    a === undefined || b === undefined || b === 0 ? undefined : Math.round((a / b) * 100) / 100;
  return {
    cpuPerCleanup: over(project.burst.cpuMsPerCleanup, floor.burst.cpuMsPerCleanup),
    sqsCallsPerCleanup: over(project.paced.perCleanup.allSqsCalls, floor.paced.perCleanup.allSqsCalls),
    dbRoundTripsPerCleanup: over(project.paced.perCleanup.dbRoundTrips, floor.paced.perCleanup.dbRoundTrips),
    burstCleanupsPerSecond: over(project.burst.cleanupsPerSecond, floor.burst.cleanupsPerSecond),
    // Server side where both were measured: the hold itself, not this process's delay in hearing of it.
    lockHoldP99:
      project.paced.serverLockHoldMs && floor.paced.serverLockHoldMs
        ? over(project.paced.serverLockHoldMs.p99, floor.paced.serverLockHoldMs.p99)
        : over(project.paced.lockHoldMs.p99, floor.paced.lockHoldMs.p99),
  };
}

/**
 * Bursts of `burstRuns` at delete latency 0, one after the other, until `memoryCleanups`: RSS at
 * start, peak and end, and after each wave what survives a forced full GC (see support/memory.ts).
 */
async function memoryRun(subRun: SubRun, profile: E2eProfile): Promise<MemoryRun> {
  const waves = Math.max(1, Math.ceil(profile.memoryCleanups / profile.burstRuns));
  const start = process.memoryUsage();
  const startAfterGc = await sampleAfterGc();
  let rssPeak = start.rss / 2 ** 20;
  let heapPeak = start.heapUsed / 2 ** 20;
  const perWave: MemoryWave[] = [];
  for (let wave = 0; wave < waves; wave += 1) {
    const figure = await subRun({
      kind: 'burst',
      runs: profile.burstRuns,
      deleteLatencyMs: 0,
      tag: `memory-${wave + 1}`,
    });
    const sampled = figure.cpu.memoryMiB;
    rssPeak = Math.max(rssPeak, sampled?.rssPeak ?? 0);
    heapPeak = Math.max(heapPeak, sampled?.heapUsedPeak ?? 0);
    perWave.push({
      cleanups: (wave + 1) * profile.burstRuns,
      rssPeakMiB: sampled?.rssPeak ?? 0,
      heapUsedPeakMiB: sampled?.heapUsedPeak ?? 0,
      afterGc: await sampleAfterGc(),
    });
  }
  const end = process.memoryUsage();
  const mib = (value: number) => Math.round(value * 10) / 10;
  const growth = memoryGrowth(perWave);
  return {
    cleanups: waves * profile.burstRuns,
    waves,
    rssStartMiB: mib(start.rss / 2 ** 20),
    rssPeakMiB: mib(rssPeak),
    rssEndMiB: mib(end.rss / 2 ** 20),
    heapUsedStartMiB: mib(start.heapUsed / 2 ** 20),
    heapUsedPeakMiB: mib(heapPeak),
    startAfterGc,
    perWave,
    ...(growth ? { growth } : {}),
  };
}

/** Wall-clock milliseconds with sub-millisecond precision, comparable with SQS SentTimestamp. */
const wallClockMs = () => performance.timeOrigin + performance.now();

async function announcePaced(
  sqs: SQSClient,
  queueUrl: string,
  runs: readonly AdmittedRun[],
  perSecond: number,
): Promise<Map<string, number>> {
  const announcedAt = new Map<string, number>();
  const started = performance.now();
  const sends: Promise<unknown>[] = [];
  for (const [index, run] of runs.entries()) {
    const due = started + (index * 1000) / perSecond;
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, due - performance.now())));
    announcedAt.set(run.runId, wallClockMs());
    sends.push(
      sqs.send(
        new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify({ runId: run.runId }) }),
      ),
    );
  }
  await Promise.all(sends);
  return announcedAt;
}

async function announceBurst(
  sqs: SQSClient,
  queueUrl: string,
  runs: readonly AdmittedRun[],
): Promise<Map<string, number>> {
  const announcedAt = new Map<string, number>();
  const batches: AdmittedRun[][] = [];
  for (let i = 0; i < runs.length; i += 10) batches.push(runs.slice(i, i + 10));
  await Promise.all(
    batches.map(async (batch) => {
      const at = wallClockMs();
      for (const run of batch) announcedAt.set(run.runId, at);
      const result = await sqs.send(
        new SendMessageBatchCommand({
          QueueUrl: queueUrl,
          Entries: batch.map((run, index) => ({
            Id: String(index),
            MessageBody: JSON.stringify({ runId: run.runId }),
          })),
        }),
      );
      if (result.Failed?.length)
        throw new Error(`run-finished batch send failed: ${JSON.stringify(result.Failed[0])}`);
    }),
  );
  return announcedAt;
}

interface CleanedEvents {
  /** Resolves when the last expected event has arrived: the end of the measured window. */
  complete: Promise<void>;
  /** Resolves when both receivers have returned (their long polls end on their own). */
  finished: Promise<{ sentAt: Map<string, number>; duplicates: number }>;
}

/**
 * The platform's consumer of runtime-cleaned: the first SentTimestamp of each expected run.
 *
 * `complete` marks the end of the measurement as soon as the last event arrived; the other
 * receiver's long poll is left to end by itself rather than aborted: the emulator does not cancel
 * a long poll whose client went away, and the message it would then take would stay invisible for
 * the visibility timeout.
 */
function collectCleaned(
  sqs: SQSClient,
  queueUrl: string,
  expected: ReadonlySet<string>,
  onCleaned?: (runId: string) => void,
): CleanedEvents {
  const sentAt = new Map<string, number>();
  let duplicates = 0;
  const deadline = Date.now() + COLLECT_TIMEOUT_MS;
  let markComplete: () => void = () => {};
  const complete = new Promise<void>((resolve) => (markComplete = resolve));
  const receiver = async () => {
    while (sentAt.size < expected.size && Date.now() < deadline) {
      const { Messages: messages = [] } = await sqs.send(
        new ReceiveMessageCommand({
          QueueUrl: queueUrl,
          MaxNumberOfMessages: 10,
          WaitTimeSeconds: 1,
          VisibilityTimeout: 60,
          MessageSystemAttributeNames: ['SentTimestamp'],
        }),
      );
      for (const message of messages) {
        const runId = (JSON.parse(message.Body ?? '{}') as { runId?: string }).runId;
        const sent = Number(message.Attributes?.SentTimestamp);
        if (!runId || !expected.has(runId)) continue;
        if (sentAt.has(runId)) duplicates += 1;
        else {
          sentAt.set(runId, sent);
          onCleaned?.(runId);
        }
      }
      if (sentAt.size === expected.size) markComplete();
      if (messages.length) {
        await sqs.send(
          new DeleteMessageBatchCommand({
            QueueUrl: queueUrl,
            Entries: messages.map((message, index) => ({
              Id: String(index),
              ReceiptHandle: message.ReceiptHandle!,
            })),
          }),
        );
      }
    }
  };
  const finished = Promise.all([receiver(), receiver()]).then(() => {
    if (sentAt.size < expected.size) {
      const missing = [...expected].filter((runId) => !sentAt.has(runId));
      throw new Error(
        `${missing.length} of ${expected.size} cleanups did not announce runtime-cleaned within ${COLLECT_TIMEOUT_MS} ms, e.g. ${missing[0]}`,
      );
    }
    return { sentAt, duplicates };
  });
  // A failure ends the window too; `finished` carries the error.
  finished.catch(() => markComplete());
  return { complete, finished };
}

async function assertNoDeadLetters(stack: Stack): Promise<void> {
  for (const queue of [QueueName.RUN_FINISHED, QueueName.RUNTIME_RELEASE, QueueName.RUNTIME_FINALIZE]) {
    const dlq = stack.createdQueues.get(deadLetterQueueName(queue));
    if (!dlq) continue;
    const { Messages = [] } = await stack.sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: dlq.url,
        MaxNumberOfMessages: 1,
        WaitTimeSeconds: 0,
        VisibilityTimeout: 0,
      }),
    );
    if (Messages.length) throw new Error(`a message was dead-lettered on ${dlq.name}: ${Messages[0]!.Body}`);
  }
}
