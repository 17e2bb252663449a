/**
 * The chaos engine: a whole local stack (real PostgreSQL, fauxqs, the local provisioner, the real
 * handlers) driven by many concurrent chaos runs, with the invariants checked while it runs and
 * once more at the end, after the faults stopped and the system drained.
 *
 * `runChaos` only sequences the parts, each in a module of its own: the stack and its
 * instrumentation (settings.ts, message-log.ts, ledger.ts, delete-probe.ts), the recorders and
 * periodic checks (recorders.ts), the runs (run-workers.ts, run-driver.ts), the final drain
 * (final-drain.ts), the final checks (final-checks.ts, nothing-lost.ts) and the result (result.ts).
 * Issue 11's faults: the run-level ones in production-faults.ts (judged in production-checks.ts),
 * the stack-wide database episodes in db-episodes.ts (the stack reaches PostgreSQL through a proxy
 * that can stall connects), and every child process watched by process-watch.ts. test/chaos/README.md
 * lists every fault kind and invariant.
 */
import { writeSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import { loadConfig } from '../../functions/adapters/config.ts';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import type { DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { createQueues } from '../../functions/adapters/queues.ts';
import { PlatformSimulator } from '../../infra/local/platform.ts';
import { type Stack, startStack } from '../../infra/local/stack.ts';
import { type ConnectStallingProxy, startConnectStallingProxy } from '../support/stalling-proxy.ts';
import { ClockSync, preciseNow } from './clock.ts';
import { DatabaseEpisodes } from './db-episodes.ts';
import { BackendTerminator } from './db-faults.ts';
import { installDeleteProbe } from './delete-probe.ts';
import { judgeFinalHistory } from './final-checks.ts';
import { drainAfterFaults } from './final-drain.ts';
import { firedBy } from './forced-fault.ts';
import { hostileMessage } from './hostile.ts';
import { Invariant } from './invariants.ts';
import { installLedger, LedgerReader } from './ledger.ts';
import { MessageLog, queueDepth } from './message-log.ts';
import { DEFAULT_MIX, FaultKind, type FaultMix } from './plan.ts';
import { FenceWatcher, ScopePool } from './platform-ops.ts';
import { ProcessWatch, type WatchedProcess } from './process-watch.ts';
import { newProductionFaultState } from './production-faults.ts';
import { mixSeed, Rng } from './random.ts';
import { installReclaimChaos, RECLAIM_CHAOS_ENV, type ReclaimChaosReport } from './reclaim-chaos.ts';
import { judgeLateRecords, judgeQuietFleet, judgeReusedIds } from './reclaim-checks.ts';
import { newReclaimFaultState, QuietFleet } from './reclaim-faults.ts';
import { Recorders } from './recorders.ts';
import { assembleResult, type ChaosResult } from './result.ts';
import type { RunContext } from './run-driver.ts';
import { playAllRuns } from './run-workers.ts';
import {
  CHAOS_ENV,
  CHAOS_TIMEOUTS,
  CHAOS_VISIBILITY_SECONDS,
  CONSUMED_QUEUES,
  HARNESS_STATEMENT_TIMEOUT_MS,
  STACK_APPLICATION_NAME,
} from './settings.ts';

export interface ChaosOptions {
  seed: number;
  runs: number;
  concurrency: number;
  /** A database the engine may migrate, instrument and fill (it is not dropped here). */
  databaseUrl: string;
  /** The driver of the stack, the harness's pools and the storm worker. */
  driver: DatabaseDriver;
  /** The WebSocket bridge, for the `neon` driver. */
  wsProxy: string;
  dataDir: string;
  mix?: FaultMix;
  /** Cycle through every fault kind first (small runs cover the whole catalogue). */
  coverage?: boolean;
  /** Force only these kinds, on every run in turn (`--kinds`: the fix-reverted proofs). */
  focus?: FaultKind[];
  /** Mean time between backend terminations while runs execute; null turns them off. */
  terminateEveryMs?: number | null;
  clearTimeoutMs?: number;
  /** How long past its window a run waits for its forced fault (coverage) to fire. */
  forcedFaultTimeoutMs?: number;
  finalDrainTimeoutMs?: number;
  logLevel?: string;
  onProgress?: (progress: { done: number; total: number; violations: number; elapsedMs: number }) => void;
  /** Told as each step after the runs begins: a long run's last minutes are not silent. */
  onStage?: (stage: string) => void;
  /** Extra StackOptions for tests (e.g. a log sink). */
  env?: Record<string, string>;
  /**
   * What follows `process.execPath` to start the storm worker; default: its source under tsx. The
   * tests start its bundle (test/support/commands.ts), about a second of CPU less.
   */
  stormWorkerArgs?: readonly string[];
  /**
   * Reclaimer hook (issue 13, reclaim-chaos.ts): run the reclaimer every 2 s with a 2 s grace,
   * inject leaked sandboxes, check invariant GC; the report is handed to `onReclaimReport`.
   */
  reclaim?: {
    onReport: (report: ReclaimChaosReport) => void;
    /** RECLAIM_GRACE_SECONDS, when not RECLAIM_CHAOS_ENV's (`--reclaim-grace`). */
    graceSeconds?: number;
    /** RECLAIM_MAX_SHARE_PERCENT, when not the product's default (`--reclaim-max-share`). */
    maxSharePercent?: number;
  };
}

/** The process the termination storm hits beside the stack: 30 connections of cleanup-shaped work. */
const STORM_WORKER = fileURLToPath(new URL('../support/termination-storm-child.ts', import.meta.url));
export const STORM_WORKER_APPLICATION_NAME = 'runtime-cleanup-storm-worker';

const COUNT_FENCES = 'SELECT count(*)::int AS n FROM agent_runs WHERE runtime_cleanup_pending';
const SERVER_VERSION = 'SELECT current_setting($1::text) AS v';

function withApplicationName(url: string, name: string): string {
  const parsed = new URL(url);
  parsed.searchParams.set('application_name', name);
  return parsed.toString();
}

export async function runChaos(options: ChaosOptions): Promise<ChaosResult> {
  const started = preciseNow();
  const startedAt = new Date().toISOString();
  const mix = options.mix ?? DEFAULT_MIX;
  const forcedFaultTimeoutMs = options.forcedFaultTimeoutMs ?? 60_000;
  const messages = new MessageLog();
  const stackErrors = new Map<string, number>();
  const harnessErrors: string[] = [];
  const env = {
    ...CHAOS_ENV,
    DATABASE_DRIVER: options.driver,
    ...(options.reclaim ? RECLAIM_CHAOS_ENV : {}),
    ...(options.reclaim?.graceSeconds !== undefined
      ? { RECLAIM_GRACE_SECONDS: String(options.reclaim.graceSeconds) }
      : {}),
    ...(options.reclaim?.maxSharePercent !== undefined
      ? { RECLAIM_MAX_SHARE_PERCENT: String(options.reclaim.maxSharePercent) }
      : {}),
    ...options.env,
  };
  const reclaimSettings = {
    graceSeconds: Number(env.RECLAIM_GRACE_SECONDS ?? RECLAIM_CHAOS_ENV.RECLAIM_GRACE_SECONDS),
    intervalSeconds: Number(env.RECLAIM_INTERVAL_SECONDS ?? RECLAIM_CHAOS_ENV.RECLAIM_INTERVAL_SECONDS),
  };

  const pools: Database[] = [];
  const open = async (name: string, max: number, lockTimeoutMs: number) => {
    const db = await openDatabase({
      url: withApplicationName(options.databaseUrl, name),
      driver: options.driver,
      wsProxy: options.wsProxy,
      maxConnections: max,
      lockTimeoutMs,
      statementTimeoutMs: HARNESS_STATEMENT_TIMEOUT_MS,
      // The harness's own connections must outlast a machine at many times its cores' load (the
      // stack keeps the production bounds: its connects are what the faults test).
      connectTimeoutMs: 30_000,
    });
    pools.push(db);
    return db;
  };
  let stack: Stack | undefined;
  let recorders: Recorders | undefined;
  let terminator: BackendTerminator | undefined;
  let fences: FenceWatcher | undefined;
  let proxy: ConnectStallingProxy | undefined;
  let episodes: DatabaseEpisodes | undefined;
  const processes = new ProcessWatch();
  const production = newProductionFaultState();
  const reclaimFaults = newReclaimFaultState();
  const config = loadConfig(env);
  try {
    // The stack reaches the database through a proxy that can stop answering new connects. It sits
    // between the WebSocket bridge and PostgreSQL (the bridge connects to the URL's host and port),
    // because the driver's WebSocket proxy setting is one for the whole process.
    const database = new URL(options.databaseUrl);
    proxy = await startConnectStallingProxy({
      host: database.hostname,
      port: Number(database.port || '5432'),
    });
    const stackUrl = new URL(withApplicationName(options.databaseUrl, STACK_APPLICATION_NAME));
    stackUrl.hostname = '127.0.0.1';
    stackUrl.port = String(proxy.port);
    // --- the stack under test, and its instrumentation -------------------------------------------
    // A reclaimer run hit by the suite's own faults is no step of invariant Q's cadence.
    const quiet = new QuietFleet(
      (startMs, endMs) =>
        (terminator?.killedAtMs ?? []).some((atMs) => atMs >= startMs && atMs <= endMs) ||
        (episodes?.windows ?? []).some((window) => window.startMs <= endMs && window.endMs >= startMs),
    );
    stack = await startStack({
      env,
      onReclaimerRun: (run) => quiet.recordReclaimerRun(run),
      databaseUrl: stackUrl.toString(),
      wsProxy: options.wsProxy,
      sqsPort: 0,
      dataDir: options.dataDir,
      logLevel: options.logLevel ?? 'SILENT',
      provisionerSeed: options.seed,
      provisionerGraceMs: 300,
      queueOverrides: { visibilityTimeoutSeconds: { ...CHAOS_VISIBILITY_SECONDS } },
      wrapQueues: (queues) => messages.wrap(queues, 'stack', { crashes: true }),
      beforeAck: messages.beforeAck,
      onStopStep: (step) => options.onStage?.(`stopping: the stack: ${step}`),
      onError: (error, source) => {
        // After the result is made (the stack stops last): said at once, past any capture of the
        // process's streams, so a stop step that failed or overran its bound is seen, and named.
        if (source === 'stop') writeSync(2, `${JSON.stringify({ chaosStackStop: error.message })}\n`);
        const key = `${source}: ${error.name}`;
        stackErrors.set(key, (stackErrors.get(key) ?? 0) + 1);
      },
    });
    const { sqs, createdQueues } = stack;
    const queueUrl = (name: string) => createdQueues.get(name)!.url;
    const provisioner = stack.provisioner;
    if (!provisioner)
      throw new Error('the chaos suite needs the built-in provisioner (unset SANDBOX_PROVISIONER_URL)');
    const admin = await open('chaos-admin', 3, 5_000);
    await installLedger(admin);
    const platformDb = await open('chaos-platform', 8, 5_000);
    const lockerDb = await open('chaos-locker', 6, 5_000);
    const probeDb = await open('chaos-probe', 6, 1_000);

    const plain = createQueues({ client: sqs });
    const platform = new PlatformSimulator(
      platformDb,
      messages.wrap(plain, 'platform'),
      stack.provisionerUrl,
    );
    const scopes = new ScopePool(platform);
    fences = new FenceWatcher(admin, 250);
    fences.start();
    const clock = new ClockSync(admin);
    await clock.sample();
    const ledger = new LedgerReader(admin);
    const onHarnessError = (message: string) => harnessErrors.push(message);

    // Invariant 3 on every DELETE; registered before any run, so it is the provisioner's first hook.
    const probe = installDeleteProbe({
      provisioner,
      scopes,
      probeDb,
      stackApplicationName: STACK_APPLICATION_NAME,
      waitMs: CHAOS_TIMEOUTS.databaseLockMs + 700,
      onHarnessError,
    });

    // Reclaimer hook (issue 13): leak injection and invariant GC, on every DELETE. The provisioner
    // awaits its query before handling the DELETE, so it has as many connections as the lock probe:
    // with two, DELETEs arriving together queued for them and missed their 1 s timeout.
    const reclaim = options.reclaim
      ? installReclaimChaos({
          provisioner,
          probeDb: await open('chaos-reclaim-probe', 6, 1_000),
          scopes,
          rng: new Rng(mixSeed(options.seed, 0x13)),
          onHarnessError,
        })
      : undefined;

    // --- recorders and the periodic invariant checks ---------------------------------------------
    recorders = new Recorders({
      ...(reclaim ? { isReclaimDelete: reclaim.isReclaimDelete } : {}),
      provisioner,
      sqs,
      cleanedQueueUrl: queueUrl('runtime-cleaned'),
      clock,
      ledger,
      messages,
      scopes,
      otherViolations: () => [...probe.violations, ...(reclaim?.violations ?? [])],
      onError: onHarnessError,
    });
    recorders.start();

    // --- the runs ----------------------------------------------------------------------------------
    // The process a storm hits beside the stack, started for each storm and watched from its start
    // to its end (invariant P): a crash under the storm is a violation with its exit code.
    const startStormWorker = async (): Promise<WatchedProcess> => {
      const worker = processes.spawn(
        'storm worker (30 connections)',
        process.execPath,
        [...(options.stormWorkerArgs ?? ['--import', 'tsx', STORM_WORKER])],
        {
          ...process.env,
          STORM_DATABASE_URL: withApplicationName(options.databaseUrl, STORM_WORKER_APPLICATION_NAME),
          STORM_SEED_URL: withApplicationName(options.databaseUrl, 'chaos-storm-seed'),
          STORM_DRIVER: options.driver,
          STORM_WS_PROXY: options.wsProxy,
          STORM_WORKERS: '30',
          STORM_FRESH_WORKERS: '6',
          STORM_DURATION_MS: String(3600 * 1000),
          STORM_PAUSE_MS: '20',
        },
      );
      // Its 30 workers connected before the storm begins.
      if (!(await worker.waitForLine('"ready":true', 60_000))) {
        harnessErrors.push('a storm worker did not get ready within 60 s');
      }
      return worker;
    };
    episodes = new DatabaseEpisodes(
      admin,
      [STACK_APPLICATION_NAME, STORM_WORKER_APPLICATION_NAME],
      STACK_APPLICATION_NAME,
      proxy,
      config.databaseConnectTimeoutMs,
      startStormWorker,
    );
    const context: RunContext = {
      platform,
      platformDb,
      lockerDb,
      provisioner,
      provisionerUrl: stack.provisionerUrl,
      messages,
      replayQueues: messages.wrap(plain, 'replay'),
      hostileQueues: messages.wrap(plain, 'hostile'),
      scopes,
      fences,
      timeouts: CHAOS_TIMEOUTS,
      hostileBodies: (rng, count) =>
        fc.sample(hostileMessage, { seed: Math.floor(rng.next() * 2 ** 31), numRuns: count }),
      clearTimeoutMs: options.clearTimeoutMs ?? 120_000,
      forcedFaultTimeoutMs,
      background: new Set(),
      production: {
        platform,
        operatorDb: platformDb,
        provisioner,
        provisionerUrl: stack.provisionerUrl,
        messages,
        forgedQueues: messages.wrap(plain, 'forged'),
        scopes,
        fences,
        timeouts: CHAOS_TIMEOUTS,
        state: production,
      },
      episodes,
      reclaimOn: reclaim !== undefined,
      reclaimSettings,
      reclaimFaults,
      adminDb: admin,
      stackApplicationName: STACK_APPLICATION_NAME,
      quiet,
    };
    terminator =
      options.terminateEveryMs === null
        ? undefined
        : new BackendTerminator(
            admin,
            STACK_APPLICATION_NAME,
            new Rng(mixSeed(options.seed, 0x7e)),
            { meanIntervalMs: options.terminateEveryMs ?? 400, pollMs: 20 },
            (kind) => messages.count(kind),
            () => quiet.windowOpen,
          );
    terminator?.start();
    const found = recorders.found;
    options.onStage?.(`runs: ${options.runs}, ${options.concurrency} at a time`);
    const runRecords = await playAllRuns({
      seed: options.seed,
      runs: options.runs,
      concurrency: options.concurrency,
      mix,
      coverage: options.coverage ?? false,
      ...(options.focus ? { focus: options.focus } : {}),
      context,
      onHarnessError,
      onRunDone: (done) =>
        options.onProgress?.({
          done,
          total: options.runs,
          violations: found.size,
          elapsedMs: preciseNow() - started,
        }),
    });
    const runPhaseMs = preciseNow() - started;

    // --- faults stop: the final drain ------------------------------------------------------------
    if (options.coverage && terminator) {
      // Backend terminations come from a timer, not from a run's plan: a coverage run waits for one.
      if (!(await firedBy(terminator.firstKill, preciseNow() + forcedFaultTimeoutMs))) {
        harnessErrors.push(
          `no stack backend was terminated during the runs (${FaultKind.DB_BACKEND_TERMINATED})`,
        );
      }
    }
    const drainStarted = preciseNow();
    options.onStage?.('faults stopping: terminator, database episodes, background work');
    await terminator?.stop();
    await episodes.settle();
    await Promise.all(context.background);
    provisioner.clearFaults();
    options.onStage?.('final drain: fences and queues');
    const drained = await drainAfterFaults({
      countFences: async () => (await admin.query<{ n: number }>(COUNT_FENCES)).rows[0]!.n,
      queueDepths: () => Promise.all(CONSUMED_QUEUES.map((queue) => queueDepth(sqs, queueUrl(queue)))),
      deadlineMs: drainStarted + (options.finalDrainTimeoutMs ?? 90_000),
    });
    // Reclaimer hook (issue 13): every injected leak reclaimed (grace + a few intervals).
    const settleMs = Math.max(
      20_000,
      (reclaimSettings.graceSeconds + 3 * reclaimSettings.intervalSeconds) * 1000 + 5_000,
    );
    if (reclaim) options.onStage?.('reclaimer settling: every injected leak reclaimed');
    const reclaimReport = reclaim ? await reclaim.settle(preciseNow() + settleMs) : undefined;
    if (reclaimReport) options.reclaim!.onReport(reclaimReport);
    const finalDrainMs = preciseNow() - drainStarted;
    options.onStage?.('recorders stopping; stalled connects judgeable');
    await recorders.stop();
    await episodes.awaitStalledConnectsJudgeable();

    // --- final collection and checks -----------------------------------------------------------
    options.onStage?.('final collection and checks');
    await clock.sample();
    await ledger.poll(true);
    recorders.collectAudit();
    await recorders.drainCleaned();
    const verdict = await judgeFinalHistory({
      history: recorders.history(Number.POSITIVE_INFINITY),
      earlier: [...found.values(), ...probe.violations, ...(reclaim?.violations ?? [])],
      runRecords,
      drained,
      admin,
      sqs,
      queueUrl,
      messages,
      cleaned: recorders.cleaned,
      scopes,
      provisioner,
      production,
      retryCapMs: Number(env.CLEANUP_RETRY_MAX_SECONDS ?? CHAOS_ENV.CLEANUP_RETRY_MAX_SECONDS) * 1000,
      stackWideFaults: episodes.windows,
      judgedElsewhere: [
        {
          invariant: Invariant.NO_PROCESS_EXITS,
          checked: processes.started,
          violations: processes.violations,
        },
        { invariant: Invariant.CONNECT_ABANDONED, ...episodes.judgeStalledConnects(performance.now()) },
        ...(reclaim
          ? [
              {
                invariant: Invariant.RECLAIMED_GENERATION_REFUSED,
                ...judgeLateRecords(reclaimFaults.lateRecords),
              },
              { invariant: Invariant.QUIET_FLEET_RECLAIMED, ...judgeQuietFleet(reclaimFaults.quietWindows) },
              {
                invariant: Invariant.DETERMINISTIC_ID_RECORDABLE_AFTER_RECLAIM,
                ...judgeReusedIds(reclaimFaults.reusedIds),
              },
            ]
          : []),
      ],
    });
    return assembleResult({
      reclaimDeletesChecked: reclaimReport?.reclaimDeletes ?? 0,
      identity: {
        seed: options.seed,
        runs: options.runs,
        concurrency: options.concurrency,
        startedAt,
        config: {
          ...env,
          visibilityTimeoutSeconds: CHAOS_VISIBILITY_SECONDS,
          maxReceiveCount: 8,
          mix,
          coverage: options.coverage ?? false,
          ...(options.focus ? { focus: options.focus } : {}),
          meanMsBetweenBackendTerminations:
            options.terminateEveryMs === null ? 'off' : (options.terminateEveryMs ?? 400),
        },
      },
      timing: { durationMs: preciseNow() - started, runPhaseMs, finalDrainMs },
      postgresVersion: (await admin.query<{ v: string }>(SERVER_VERSION, ['server_version'])).rows[0]!.v,
      verdict,
      runRecords,
      foundDuringRun: found.size,
      faultsInjected: messages.injected,
      dbKillsByPhase: terminator?.killsByPhase ?? new Map(),
      probe: { counts: probe.counts, probed: probe.probed() },
      harnessErrors,
      clock: clock.summary(),
      stackErrors,
      episodes: {
        terminationStorms: episodes.stormReports,
        stalledConnects: proxy.stalledConnects.length,
        forceClears: production.forceClears,
        forgedReleases: production.forged.size,
        // The reclaimer's faults (issue 21): each late record and its refusal, each quiet window.
        reclaimLateRecords: reclaimFaults.lateRecords,
        reusedIds: reclaimFaults.reusedIds.map((attempt) => ({
          refused: attempt.refused,
          boundMs: attempt.boundMs,
          recordedAfterMs:
            attempt.acceptedAtMs === undefined
              ? null
              : Math.round(attempt.acceptedAtMs - attempt.deletedAtMs),
        })),
        quietWindows: reclaimFaults.quietWindows.map((window) => ({
          graceMs: window.graceMs,
          reclaimerRuns: window.reclaimerRuns.length,
          reclaimedAfterMs: window.leaks.map((leak) =>
            leak.goneAtMs === undefined ? null : Math.round(leak.goneAtMs - leak.createdAtMs),
          ),
        })),
      },
    });
  } finally {
    // Each step named, so that a shutdown that hangs says which (test/chaos/watchdog.ts).
    options.onStage?.('stopping: child processes');
    await processes.stopAll();
    options.onStage?.('stopping: recorders and terminator');
    await recorders?.stop().catch(() => {});
    await terminator?.stop().catch(() => {});
    fences?.stop();
    // Before the stack: a connect still stalled in the proxy (a client that never gives up on it,
    // invariant T's violation) would otherwise hold the stack's shutdown forever.
    options.onStage?.('stopping: connect-stalling proxy');
    await proxy?.close().catch(() => {});
    options.onStage?.('stopping: the stack');
    await stack?.stop().catch(() => {});
    options.onStage?.('stopping: harness pools');
    await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
    options.onStage?.('stopped');
  }
}
