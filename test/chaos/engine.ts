import { cpus, totalmem } from 'node:os';
import type { Message } from '@aws-sdk/client-sqs';
import fc from 'fast-check';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import type { ReleaseCommand } from '../../functions/adapters/messages.ts';
import { postgresTimestampMs } from '../../functions/adapters/publish.ts';
import { createQueues, deadLetterQueueName } from '../../functions/adapters/queues.ts';
import { PlatformSimulator } from '../../infra/local/platform.ts';
import type { AuditEntry } from '../../infra/local/provisioner/server.ts';
import { type Stack, startStack } from '../../infra/local/stack.ts';
import { ClockSync, preciseNow } from './clock.ts';
import { BackendTerminator } from './db-faults.ts';
import { firedBy } from './forced-fault.ts';
import { expectedFate, FATE_CODES, hostileMessage } from './hostile.ts';
import {
  type CapturedRelease,
  type CheckCounts,
  checkPathsEncoded,
  checkSafety,
  convergenceOf,
  type DeleteRequest,
  Invariant,
  percentile,
  type Violation,
} from './invariants.ts';
import { installLedger, LedgerReader } from './ledger.ts';
import { LockProbe, type ProbeVerdict } from './lock-probe.ts';
import { MessageLog, queueDepth, runIdOf, takeAll } from './message-log.ts';
import {
  COVERAGE_CYCLE,
  type ConsumedQueue,
  DEFAULT_MIX,
  drawPlan,
  FaultKind,
  type FaultMix,
  LYING_PROVISIONER_FAULTS,
  type Timeouts,
} from './plan.ts';
import { FenceWatcher, ScopePool } from './platform-ops.ts';
import { mixSeed, Rng, runRng } from './random.ts';
import { playRun, type RunContext, type RunRecord } from './run-driver.ts';

/**
 * The chaos engine: a whole local stack (real PostgreSQL, fauxqs, the local provisioner, the real
 * handlers) driven by many concurrent chaos runs, with the invariants checked while it runs and
 * once more at the end, after the faults stopped and the system drained.
 */

/** The stack's database connections carry this name; terminations and the probe key on it. */
export const STACK_APPLICATION_NAME = 'runtime-cleanup-stack';

/**
 * The chaos configuration (contract §4 variables). Timeouts are short so that failures play out
 * in seconds; their relations are the deployed ones (cleanup timeout > lock wait + delete timeout).
 */
export const CHAOS_ENV = {
  CLEANUP_RETRY_BASE_SECONDS: '1',
  CLEANUP_RETRY_MAX_SECONDS: '2',
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '1',
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '1',
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '3',
  FENCE_SWEEP_AFTER_SECONDS: '4',
  FENCE_SWEEP_INTERVAL_SECONDS: '1',
  DATABASE_LOCK_TIMEOUT_MS: '500',
  DATABASE_STATEMENT_TIMEOUT_MS: '3000',
} as const;

/** Visibility timeouts of the consumed queues (the shape of the deployed ones, in seconds). */
export const CHAOS_VISIBILITY_SECONDS = {
  'run-finished': 4,
  'runtime-release.fifo': 8,
  'runtime-finalize': 4,
} as const;

export const CHAOS_TIMEOUTS: Timeouts = {
  provisionerDeleteMs: Number(CHAOS_ENV.SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS) * 1000,
  databaseLockMs: Number(CHAOS_ENV.DATABASE_LOCK_TIMEOUT_MS),
  runtimeCleanupMs: Number(CHAOS_ENV.SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS) * 1000,
};

/**
 * The stated convergence bound: once a run's faults stopped (and its scope went idle), its fence
 * clears within the longest way a cleanup can be delayed *without* faults, plus the time to run
 * the three phases on a loaded machine:
 *
 *   a message crashed in flight reappears after the release queue's visibility timeout (8 s),
 *   or a dead-lettered one is re-announced by the sweeper after FENCE_SWEEP_AFTER + one interval
 *   (4 + 1 s) — whichever path, at most max(8, 5) s;
 *   one retry backoff at CLEANUP_RETRY_MAX (2 s) for a failure that began just before the stop;
 *   an identity change restarts at phase 1 once (another chain) — bounded by 2 × the chain;
 *   the chain itself (three receives, two transactions, one delete) is sub-second unloaded; on
 *   two cores shared by 30–40 concurrent runs, a terminator and the probe, give it 5 s.
 *
 *   bound = 8 + 2 + 2 × 5 = 20 s
 */
export const CONVERGENCE_BOUND_MS = 20_000;

export interface ChaosOptions {
  seed: number;
  runs: number;
  concurrency: number;
  /** A database the engine may migrate, instrument and fill (it is not dropped here). */
  databaseUrl: string;
  wsProxy: string;
  dataDir: string;
  mix?: FaultMix;
  /** Cycle through every fault kind first (small runs cover the whole catalogue). */
  coverage?: boolean;
  /** Mean time between backend terminations while runs execute; null turns them off. */
  terminateEveryMs?: number | null;
  clearTimeoutMs?: number;
  /** How long past its window a run waits for its forced fault (coverage) to fire. */
  forcedFaultTimeoutMs?: number;
  finalDrainTimeoutMs?: number;
  logLevel?: string;
  onProgress?: (progress: { done: number; total: number; violations: number; elapsedMs: number }) => void;
  /** Extra StackOptions for tests (e.g. a log sink). */
  env?: Record<string, string>;
}

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
}

function withApplicationName(url: string, name: string): string {
  const parsed = new URL(url);
  parsed.searchParams.set('application_name', name);
  return parsed.toString();
}

const COUNT_FENCES = 'SELECT count(*)::int AS n FROM agent_runs WHERE runtime_cleanup_pending';
const LIST_FENCES = 'SELECT id FROM agent_runs WHERE runtime_cleanup_pending ORDER BY id';
const SERVER_VERSION = 'SELECT current_setting($1::text) AS v';
const EXPLAIN_FENCE = `
  SELECT status, runtime_cleanup_pending, runtime_cleanup_pending_since::text AS pending_since,
         runtime_cleanup_announced_at::text AS announced_at
  FROM agent_runs WHERE id = $1::text`;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const CONSUMED: readonly ConsumedQueue[] = ['run-finished', 'runtime-release.fifo', 'runtime-finalize'];

export async function runChaos(options: ChaosOptions): Promise<ChaosResult> {
  const started = preciseNow();
  const startedAt = new Date().toISOString();
  const mix = options.mix ?? DEFAULT_MIX;
  const messages = new MessageLog();
  const stackErrors = new Map<string, number>();
  const harnessErrors: string[] = [];
  const env = { ...CHAOS_ENV, ...options.env };

  const pools: Database[] = [];
  const open = async (name: string, max: number, lockTimeoutMs: number) => {
    const db = await openDatabase({
      url: withApplicationName(options.databaseUrl, name),
      wsProxy: options.wsProxy,
      maxConnections: max,
      lockTimeoutMs,
      statementTimeoutMs: 20_000,
    });
    pools.push(db);
    return db;
  };
  let stack: Stack | undefined;
  const timers: NodeJS.Timeout[] = [];
  let terminator: BackendTerminator | undefined;
  let fences: FenceWatcher | undefined;
  try {
    stack = await startStack({
      env,
      databaseUrl: withApplicationName(options.databaseUrl, STACK_APPLICATION_NAME),
      wsProxy: options.wsProxy,
      sqsPort: 0,
      dataDir: options.dataDir,
      logLevel: options.logLevel ?? 'SILENT',
      provisionerSeed: options.seed,
      provisionerGraceMs: 300,
      queueOverrides: { visibilityTimeoutSeconds: { ...CHAOS_VISIBILITY_SECONDS } },
      wrapQueues: (queues) => messages.wrap(queues, 'stack', { crashes: true }),
      beforeAck: messages.beforeAck,
      onError: (error, source) => {
        const key = `${source}: ${error.name}`;
        stackErrors.set(key, (stackErrors.get(key) ?? 0) + 1);
      },
    });
    const provisioner = stack.provisioner;
    if (!provisioner)
      throw new Error('the chaos suite needs the built-in provisioner (unset SANDBOX_PROVISIONER_URL)');
    const admin = await open('chaos-admin', 3, 5_000);
    await installLedger(admin);
    const platformDb = await open('chaos-platform', 8, 5_000);
    const lockerDb = await open('chaos-locker', 6, 5_000);
    const probeDb = await open('chaos-probe', 6, 1_000);

    const plain = createQueues({ client: stack.sqs });
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

    // --- invariant 3: the probe on every DELETE ------------------------------------------------
    const probe = new LockProbe(probeDb, STACK_APPLICATION_NAME, CHAOS_TIMEOUTS.databaseLockMs + 700);
    const probeCounts = new Map<string, number>();
    const probeViolations: Violation[] = [];
    provisioner.onRequest(async (info) => {
      if (info.method !== 'DELETE') return;
      const scope = info.sandboxId === undefined ? undefined : scopes.scopeOfSandbox(info.sandboxId);
      if (!scope) {
        probeCounts.set('unmapped_sandbox', (probeCounts.get('unmapped_sandbox') ?? 0) + 1);
        return;
      }
      let verdict: ProbeVerdict;
      try {
        verdict = await probe.probe(scope);
      } catch (error) {
        probeCounts.set('probe_error', (probeCounts.get('probe_error') ?? 0) + 1);
        harnessErrors.push(`probe: ${(error as Error).message}`);
        return;
      }
      probeCounts.set(verdict.kind, (probeCounts.get(verdict.kind) ?? 0) + 1);
      if (verdict.kind === 'violation') {
        probeViolations.push({
          invariant: Invariant.NO_LOCK_HELD_DURING_PROVISIONER_CALL,
          key: `3:${info.sandboxId}#${info.generation}:${preciseNow()}`,
          message: `a cleanup transaction held a lock of scope ${scope.runtimeScopeId} for ${Math.round(verdict.heldForMs)} ms while DELETE ${info.sandboxId}?generation=${info.generation} was in flight`,
          details: { ...verdict, sandboxId: info.sandboxId, generation: info.generation },
        });
      }
    });

    // --- recorders -----------------------------------------------------------------------------
    const audit = new Map<number, AuditEntry>();
    const collectAudit = () => {
      for (const entry of provisioner.audit()) audit.set(entry.seq, entry);
    };
    const cleaned = new Map<string, number>();
    const cleanedUrl = stack.createdQueues.get('runtime-cleaned')!.url;
    const drainCleaned = async () => {
      for (const message of await takeAll(stack!.sqs, cleanedUrl)) {
        const runId = runIdOf(message.Body ?? '');
        if (runId) cleaned.set(runId, (cleaned.get(runId) ?? 0) + 1);
      }
    };
    let recording: Promise<unknown> = Promise.resolve();
    const every = (ms: number, work: () => Promise<unknown>) => {
      const timer = setInterval(() => {
        recording = Promise.all([
          recording,
          work().catch((error: Error) => harnessErrors.push(error.message)),
        ]);
      }, ms);
      timers.push(timer);
    };
    every(500, async () => collectAudit());
    every(1_000, drainCleaned);
    every(2_000, () => clock.sample());
    every(250, async () => clock.sampleWall());

    // --- periodic invariant checks, while the runs execute --------------------------------------
    const found = new Map<string, Violation & { foundAtMs: number }>();
    const runRecords: RunRecord[] = [];
    const history = (settledBeforeMs: number) =>
      buildHistory(ledger, clock, audit, messages, scopes, settledBeforeMs);
    const checkNow = async () => {
      await ledger.poll();
      collectAudit();
      // Events of the last few seconds may not be fully recorded yet (a commit still on its way).
      const { violations } = checkSafety(history(preciseNow() - 5_000));
      for (const violation of [...violations, ...probeViolations]) {
        if (!found.has(violation.key)) found.set(violation.key, { ...violation, foundAtMs: preciseNow() });
      }
    };
    every(5_000, checkNow);

    // --- the runs ------------------------------------------------------------------------------
    const hostileBodies = (rng: Rng, count: number) =>
      fc.sample(hostileMessage, { seed: Math.floor(rng.next() * 2 ** 31), numRuns: count });
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
      hostileBodies,
      clearTimeoutMs: options.clearTimeoutMs ?? 120_000,
      forcedFaultTimeoutMs: options.forcedFaultTimeoutMs ?? 60_000,
      background: new Set(),
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
          );
    terminator?.start();

    let next = 0;
    let done = 0;
    const worker = async () => {
      for (;;) {
        const index = next;
        if (index >= options.runs) return;
        next += 1;
        const rng = runRng(options.seed, index);
        // The coverage cycle forces one kind per run for the first runs only; the rest are random.
        const forced = options.coverage ? COVERAGE_CYCLE[index] : undefined;
        const plan = drawPlan(index, rng, mix, CHAOS_TIMEOUTS, forced);
        if (plan.provisionerKinds.some((kind) => LYING_PROVISIONER_FAULTS.has(kind))) {
          // A lie leaves the sandbox live with the fence down; a new run or a late duplicate in
          // that scope would then meet a sandbox the protocol was told is gone. Keep lies alone.
          plan.admissionAttemptsAtMs = [];
          plan.replays = [];
          plan.recreateSandbox = null;
        }
        try {
          runRecords.push(await playRun(context, plan, rng));
        } catch (error) {
          harnessErrors.push(`run ${index}: ${(error as Error).stack ?? (error as Error).message}`);
        }
        done += 1;
        options.onProgress?.({
          done,
          total: options.runs,
          violations: found.size,
          elapsedMs: preciseNow() - started,
        });
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, options.concurrency) }, worker));
    const runPhaseMs = preciseNow() - started;

    // --- faults stop: the final drain ------------------------------------------------------------
    if (options.coverage && terminator) {
      // Backend terminations come from a timer, not from a run's plan: a coverage run waits for one.
      const killed = await firedBy(
        terminator.firstKill,
        preciseNow() + (options.forcedFaultTimeoutMs ?? 60_000),
      );
      if (!killed)
        harnessErrors.push(
          `no stack backend was terminated during the runs (${FaultKind.DB_BACKEND_TERMINATED})`,
        );
    }
    const drainStarted = preciseNow();
    await terminator?.stop();
    await Promise.all(context.background);
    provisioner.clearFaults();
    const consumedUrls = CONSUMED.map((queue) => stack!.createdQueues.get(queue)!.url);
    const drainDeadline = drainStarted + (options.finalDrainTimeoutMs ?? 90_000);
    let drained = false;
    while (preciseNow() < drainDeadline) {
      const fenced = await admin.query<{ n: number }>(COUNT_FENCES);
      // Empty queues (nothing visible, in flight or delayed): every message was taken off, by an
      // acknowledgement or by SQS's own redrive; the final check tells which.
      const depths = await Promise.all(consumedUrls.map((url) => queueDepth(stack!.sqs, url)));
      if (fenced.rows[0]!.n === 0 && depths.every((depth) => depth === 0)) {
        drained = true;
        break;
      }
      await sleep(250);
    }
    const finalDrainMs = preciseNow() - drainStarted;
    for (const timer of timers) clearInterval(timer);
    await recording;

    // --- final collection and checks -----------------------------------------------------------
    await clock.sample();
    await ledger.poll(true);
    collectAudit();
    await drainCleaned();
    const deadLetters = new Map<ConsumedQueue, Message[]>();
    for (const queue of CONSUMED) {
      deadLetters.set(
        queue,
        await takeAll(stack.sqs, stack.createdQueues.get(deadLetterQueueName(queue))!.url),
      );
    }
    const finalHistory = history(Number.POSITIVE_INFINITY);
    const safety = checkSafety(finalHistory);
    const violations = new Map<string, Violation>();
    for (const violation of [...found.values(), ...safety.violations, ...probeViolations]) {
      violations.set(violation.key, violation);
    }

    // 4: convergence
    const localRunLog = finalHistory.runLog;
    const convergence = convergenceOf(localRunLog, runRecords);
    for (const sample of convergence.samples) {
      if (sample.convergenceMs <= CONVERGENCE_BOUND_MS) continue;
      violations.set(`4:${sample.runId}`, {
        invariant: Invariant.CONVERGENCE,
        key: `4:${sample.runId}`,
        message: `fence of ${sample.runId} took ${Math.round(sample.convergenceMs)} ms to clear after its faults stopped (bound ${CONVERGENCE_BOUND_MS} ms)`,
        details: { ...sample },
      });
    }
    for (const runId of convergence.uncleared) {
      violations.set(`4:${runId}`, {
        invariant: Invariant.CONVERGENCE,
        key: `4:${runId}`,
        message: `fence of ${runId} never cleared`,
        details: { runId, ...(await explainFence(admin, messages, deadLetters, runId)) },
      });
    }

    // 5: nothing lost
    const nothingLost = checkNothingLost({
      drained,
      messages,
      deadLetters,
      cleaned,
      runLog: localRunLog,
      stillFenced: (await admin.query<{ id: string }>(LIST_FENCES)).rows.map((row) => row.id),
      audit: finalHistory.deletes,
    });
    for (const violation of nothingLost.violations) violations.set(violation.key, violation);

    // 1b: no sandbox left behind, except the ones a lying answer was expected to leave
    const expectedLeakSandboxes = new Set(
      scopes.all.filter((scope) => scope.retired).flatMap((scope) => [...scope.sandboxIds]),
    );
    const live = provisioner.liveSandboxes();
    const leaks = live.filter((sandbox) => !expectedLeakSandboxes.has(sandbox.id));
    for (const sandbox of leaks) {
      violations.set(`1b:${sandbox.id}#${sandbox.generation}`, {
        invariant: Invariant.NO_SANDBOX_LEAKED,
        key: `1b:${sandbox.id}#${sandbox.generation}`,
        message: `sandbox ${sandbox.id} generation ${sandbox.generation} is still live although every fence is down`,
        details: {
          sandboxId: sandbox.id,
          generation: sandbox.generation,
          scope: scopes.scopeOfSandbox(sandbox.id),
          deletes: finalHistory.deletes.filter((d) => d.sandboxId === sandbox.id),
          recorded: finalHistory.sandboxLog.filter((e) => e.sandboxId === sandbox.id),
        },
      });
    }

    // S1: every request path the provisioner saw carried its sandbox id as one encoded segment.
    const paths = checkPathsEncoded(finalHistory.deletes);
    for (const violation of paths.violations) violations.set(violation.key, violation);

    const sandboxesCreated = new Set(finalHistory.sandboxLog.map((e) => `${e.sandboxId}#${e.generation}`))
      .size;
    const all = [...violations.values()];
    const count = (invariant: Invariant) =>
      all.filter((violation) => violation.invariant === invariant).length;
    const counts: CheckCounts = safety.counts;
    const probed = [...probeCounts.entries()]
      .filter(([kind]) => kind !== 'unmapped_sandbox' && kind !== 'probe_error')
      .reduce((sum, [, n]) => sum + n, 0);
    const convergenceValues = convergence.samples.map((sample) => sample.convergenceMs);
    const fenceToClear = convergence.samples.map((sample) => sample.fenceToClearMs);
    const stillFenced = convergence.samples
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
    harnessErrors.push(
      ...runRecords.flatMap((record) => record.errors.map((e) => `run ${record.index}: ${e}`)),
    );
    const result: ChaosResult = {
      seed: options.seed,
      runs: options.runs,
      concurrency: options.concurrency,
      startedAt,
      durationMs: preciseNow() - started,
      runPhaseMs,
      finalDrainMs,
      machine: {
        cpus: cpus().length,
        cpuModel: cpus()[0]?.model ?? 'unknown',
        memoryGiB: Math.round(totalmem() / 2 ** 30),
        node: process.version,
        platform: `${process.platform}-${process.arch}`,
        postgres: (await admin.query<{ v: string }>(SERVER_VERSION, ['server_version'])).rows[0]!.v,
      },
      config: {
        ...env,
        visibilityTimeoutSeconds: CHAOS_VISIBILITY_SECONDS,
        maxReceiveCount: 8,
        mix,
        coverage: options.coverage ?? false,
        meanMsBetweenBackendTerminations:
          options.terminateEveryMs === null ? 'off' : (options.terminateEveryMs ?? 400),
      },
      faultsInjected: Object.fromEntries(
        [...messages.injected.entries()].sort(([a], [b]) => a.localeCompare(b)),
      ),
      dbKillsByPhase: Object.fromEntries(terminator?.killsByPhase ?? []),
      checks: {
        [Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE]: {
          checked: counts.clearsChecked,
          violations: count(Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE),
        },
        // Every sandbox generation ever recorded is checked for being gone (or an expected leak).
        [Invariant.NO_SANDBOX_LEAKED]: {
          checked: sandboxesCreated,
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
          checked: probed,
          violations: count(Invariant.NO_LOCK_HELD_DURING_PROVISIONER_CALL),
        },
        [Invariant.CONVERGENCE]: {
          checked: convergence.samples.length + convergence.uncleared.length,
          violations: count(Invariant.CONVERGENCE),
        },
        [Invariant.NOTHING_LOST]: { checked: nothingLost.checked, violations: count(Invariant.NOTHING_LOST) },
        [Invariant.IDS_PERCENT_ENCODED]: {
          checked: paths.checked,
          violations: count(Invariant.IDS_PERCENT_ENCODED),
        },
      },
      coverage: coverageOf(runRecords),
      foundDuringRun: found.size,
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
      probe: Object.fromEntries(probeCounts),
      deadLetters: Object.fromEntries(
        [...deadLetters.entries()].map(([queue, list]) => [
          queue,
          list.reduce<Record<string, number>>((byCode, message) => {
            const code = message.MessageAttributes?.errorCode?.StringValue ?? '(none)';
            byCode[code] = (byCode[code] ?? 0) + 1;
            return byCode;
          }, {}),
        ]),
      ),
      deadLetterSamples: [...deadLetters.entries()].flatMap(([queue, list]) => {
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
      }),
      violatingRuns: runRecords.filter((record) =>
        all.some((violation) => record.rootRunIds.some((runId) => JSON.stringify(violation).includes(runId))),
      ),
      messages: nothingLost.messageCounts,
      admissions,
      sandboxes: {
        created: sandboxesCreated,
        leftLiveAtEnd: live.length,
        expectedLeaks: live.length - leaks.length,
      },
      harnessErrors,
      clock: clock.summary(),
      stackErrors: Object.fromEntries(stackErrors),
    };
    return result;
  } finally {
    for (const timer of timers) clearInterval(timer);
    await terminator?.stop().catch(() => {});
    fences?.stop();
    await stack?.stop().catch(() => {});
    await Promise.all(pools.map((pool) => pool.end().catch(() => {})));
  }
}

function coverageOf(records: readonly RunRecord[]): ChaosResult['coverage'] {
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

function buildHistory(
  ledger: LedgerReader,
  clock: ClockSync,
  audit: Map<number, AuditEntry>,
  messages: MessageLog,
  scopes: ScopePool,
  settledBeforeMs: number,
) {
  const runLog = [...ledger.runs.values()].map((entry) => ({
    ...entry,
    atMs: clock.toLocal(entry.atMs),
    pendingSinceMs: entry.pendingSinceMs === null ? null : clock.toLocal(entry.pendingSinceMs),
  }));
  const sandboxLog = [...ledger.sandboxes.values()].map((entry) => ({
    ...entry,
    atMs: clock.toLocal(entry.atMs),
  }));
  const deletes: DeleteRequest[] = [...audit.values()]
    .filter((entry) => entry.method === 'DELETE')
    .map((entry) => ({
      seq: entry.seq,
      path: entry.path,
      sandboxId: entry.sandboxId,
      generation: entry.generation,
      status: entry.status,
      outcome: entry.outcome,
      fault: entry.fault,
      startedAt: entry.startedAt,
      endedAt: entry.endedAt,
      deletedGeneration: entry.deletedGeneration,
    }));
  const releases: CapturedRelease[] = [];
  for (const message of messages.sent.values()) {
    if (message.queue !== 'runtime-release.fifo' || message.origin === 'hostile') continue;
    const body = JSON.parse(message.body) as ReleaseCommand;
    releases.push({
      origin: message.origin,
      sentAtMs: message.sentAtMs,
      runId: body.runId,
      uid: body.uid,
      runtimeScopeId: body.runtimeScopeId,
      sandboxId: body.sandboxId,
      generation: body.generation,
      fenceSetAt: body.fenceSetAt,
    });
  }
  return {
    runLog,
    sandboxLog,
    deletes,
    sandboxScope: scopes.sandboxScopes(),
    releases,
    fenceTextToLocalMs: (text: string) => clock.toLocal(postgresTimestampMs(text)),
    settledBeforeMs,
  };
}

/** For a fence that never cleared: what is (or is not) on its way to it. */
async function explainFence(
  admin: Database,
  messages: MessageLog,
  deadLetters: Map<ConsumedQueue, Message[]>,
  runId: string,
): Promise<Record<string, unknown>> {
  const { rows } = await admin.query(EXPLAIN_FENCE, [runId]);
  return {
    row: rows[0],
    messagesSent: messages
      .messagesOf(runId)
      .map((m) => ({ queue: m.queue, origin: m.origin, acked: messages.acked.has(m.messageId) })),
    deadLetters: [...deadLetters.entries()].flatMap(([queue, list]) =>
      list
        .filter((message) => runIdOf(message.Body ?? '') === runId)
        .map((message) => ({ queue, errorCode: message.MessageAttributes?.errorCode?.StringValue })),
    ),
  };
}

/**
 * Invariant 5: every message sent to a consumed queue was taken off it (processed, or dead-lettered
 * by the function with its reason); every dead letter carries a reason and an error code and came
 * from a message that was sent; no fence is left up; every cleared fence was announced on
 * runtime-cleaned at least once; every hostile message met the fate its body calls for.
 */
function checkNothingLost(input: {
  drained: boolean;
  messages: MessageLog;
  deadLetters: Map<ConsumedQueue, Message[]>;
  cleaned: Map<string, number>;
  runLog: readonly { runId: string; runType: string; pending: boolean }[];
  stillFenced: string[];
  audit: readonly DeleteRequest[];
}): { violations: Violation[]; checked: number; messageCounts: Record<string, number> } {
  const { messages, deadLetters } = input;
  const violations: Violation[] = [];
  const lost = (key: string, message: string, details?: Record<string, unknown>) =>
    violations.push({
      invariant: Invariant.NOTHING_LOST,
      key: `5:${key}`,
      message,
      ...(details ? { details } : {}),
    });
  let checked = 0;

  if (!input.drained)
    lost(
      'drain',
      'the system did not drain (fences, queue depth or unacknowledged messages) before the deadline',
    );
  for (const runId of input.stillFenced) {
    checked += 1;
    lost(`fenced:${runId}`, `run ${runId} is still fenced at the end`);
  }
  const consumed = [...messages.sent.values()].filter((m) => CONSUMED.includes(m.queue as ConsumedQueue));
  const deadLettered = new Map<string, { queue: ConsumedQueue; errorCode: string | undefined }>();
  const redriven: Array<{ queue: ConsumedQueue; messageId: string }> = [];
  for (const [queue, list] of deadLetters) {
    for (const letter of list) {
      checked += 1;
      const attributes = letter.MessageAttributes ?? {};
      const source = attributes.sourceMessageId?.StringValue;
      const reason = attributes.reason?.StringValue;
      const errorCode = attributes.errorCode?.StringValue;
      if (!reason || !errorCode || !source) {
        // SQS's own redrive (past maxReceiveCount) keeps the message id and adds no reason.
        redriven.push({ queue, messageId: letter.MessageId! });
        continue;
      }
      if (!messages.sent.has(source)) {
        lost(
          `orphan:${letter.MessageId}`,
          `dead letter ${letter.MessageId} names a source message nobody sent`,
          { source },
        );
      }
      deadLettered.set(source, { queue, errorCode });
    }
  }
  // A redriven copy is acceptable only beside a copy with its reason: the function dead-lettered
  // the message on its last allowed receive, then a crash lost the acknowledgement, and SQS moved
  // the original too. A redriven message with no reasoned copy was parked without a reason.
  let redrivenAfterReasonedCopy = 0;
  for (const { queue, messageId } of redriven) {
    if (deadLettered.has(messageId)) {
      redrivenAfterReasonedCopy += 1;
      continue;
    }
    lost(
      `reasonless:${messageId}`,
      `message ${messageId} reached the ${queue} DLQ with no reason (SQS redrive)`,
    );
  }
  for (const message of consumed) {
    checked += 1;
    if (messages.acked.has(message.messageId) || deadLettered.has(message.messageId)) continue;
    lost(
      `unacked:${message.messageId}`,
      `message ${message.messageId} on ${message.queue} was neither processed nor dead-lettered with a reason`,
      {
        queue: message.queue,
        origin: message.origin,
        runId: message.runId,
      },
    );
  }
  const clearedRoots = new Set<string>();
  for (const entry of input.runLog) {
    if (entry.runType !== 'subagent' && !entry.pending) clearedRoots.add(entry.runId);
  }
  const everFenced = new Set(input.runLog.filter((e) => e.pending).map((e) => e.runId));
  for (const runId of everFenced) {
    if (!clearedRoots.has(runId) || input.stillFenced.includes(runId)) continue;
    checked += 1;
    if (!input.cleaned.has(runId))
      lost(`cleaned:${runId}`, `run ${runId} was cleared but never announced on runtime-cleaned`);
  }
  let hostile = 0;
  for (const message of consumed) {
    if (message.origin !== 'hostile') continue;
    hostile += 1;
    checked += 1;
    const fate = expectedFate(message.queue as ConsumedQueue, message.body);
    const letter = deadLettered.get(message.messageId);
    if (letter && FATE_CODES[fate].includes(letter.errorCode ?? '')) continue;
    lost(
      `hostile:${message.messageId}`,
      `a hostile message on ${message.queue} was not dead-lettered as ${FATE_CODES[fate].join(' or ')}`,
      {
        got: letter ?? null,
        body: message.body.slice(0, 200),
      },
    );
  }
  return {
    violations,
    checked,
    messageCounts: {
      sentToConsumedQueues: consumed.length,
      acknowledged: consumed.filter((m) => messages.acked.has(m.messageId)).length,
      deadLettered: [...deadLetters.values()].reduce((sum, list) => sum + list.length, 0),
      replayed: consumed.filter((m) => m.origin === 'replay').length,
      hostile,
      runtimeCleanedEvents: [...input.cleaned.values()].reduce((sum, n) => sum + n, 0),
      redrivenCopiesBesideAReasonedOne: redrivenAfterReasonedCopy,
      deletesSeenByProvisioner: input.audit.length,
    },
  };
}
