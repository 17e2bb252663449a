/**
 * Part 1: lock hold and contention against delete latency, one design at a time.
 *
 * Each round admits one root run in each of `scopes` scopes the way the platform does (scope lock,
 * `runtime_cleanup_blocked`, a real sandbox process at the provisioner), finishes it (fence up),
 * waits for the sandboxes to boot, then starts the contention load (lease renewals and recovery
 * transactions on those very runs and scopes, in a process of its own: `load-process.ts`) and all
 * the cleanups at once, in this process. The round ends when every cleanup has returned; the load
 * is stopped then, its in-flight operations awaited. A round counts only if every cleanup cleared
 * its fence and its sandbox generation was really deleted.
 *
 * The split design runs its three phases in-process (fence check, release, finalize), without the
 * queues between them: this part isolates what the database sees. Part 2 adds the queues.
 */
import type { CleanupConfig } from '../../functions/adapters/config.ts';
import type { PooledDatabase } from '../../functions/adapters/database.ts';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { createQueues } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { release } from '../../functions/cleanup/release.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import { FenceCheckOutcome, FinalizeOutcome, ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { PlatformSimulator, type ScopeRef } from '../../infra/local/platform.ts';
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import {
  BaselineOutcome,
  cleanupWithDeleteInsideTransaction,
} from '../baseline/delete-inside-transaction.ts';
import { admitAndFinish, assertConverged, describeError } from '../support/convergence.ts';
import {
  type CpuReport,
  mergeCpuReports,
  mergeProcessReports,
  type ProcessReport,
  startCpuProbe,
} from '../support/cpu.ts';
import { floorCheck, floorClear } from '../support/floor-transactions.ts';
import { limitInFlight } from '../support/in-flight-limit.ts';
import { type LockHoldSample, withLockHoldProbe } from '../support/lock-hold.ts';
import { PRODUCTION_LOCK_TIMEOUT_MS, warmPool } from '../support/pools.ts';
import type { BenchDatabase, BenchPostgres } from '../support/postgres.ts';
import { waitForSandboxesReady } from '../support/sandboxes.ts';
import { type Summary, summarize } from '../support/stats.ts';
import type { LoadResult } from './contention-load.ts';
import { startLoadProcess } from './load-process.ts';

/**
 * `floor`: no logic (issue 15), the lock-hold yardstick measured under the same load: the floor's
 * two one-trip transactions (`bench/support/floor-transactions.ts`) around one DELETE.
 */
export const Design = { SPLIT: 'split', BASELINE: 'baseline', FLOOR: 'floor' } as const;
export type Design = (typeof Design)[keyof typeof Design];

/**
 * A design run with a given pool of connections for its cleanup transactions. The baseline needs a
 * connection per cleanup in flight (it holds one across the delete); the split protocol holds one
 * only for its two short transactions, so it is measured both with the baseline's pool and with
 * the pool a deployed function has (5, functions/adapters/dependencies.ts).
 */
export interface LockVariant {
  id: string;
  design: Design;
  connections: number;
  label: string;
  /**
   * At most this many cleanups in flight at once (the rest start as earlier ones return), as one
   * deployed function instance processes one SQS batch of up to 10 records at a time. Absent:
   * every cleanup of the round at once.
   */
  cleanupsInFlight?: number;
}

export const VariantId = {
  SPLIT_DEPLOYED_POOL: 'split-deployed-pool',
  SPLIT_SAME_POOL: 'split',
  BASELINE: 'baseline',
  SPLIT_ONE_INSTANCE: 'split-one-instance',
  FLOOR_DEPLOYED_POOL: 'floor-deployed-pool',
} as const;

/** The deployed functions' pool size (functions/adapters/dependencies.ts). */
export const DEPLOYED_POOL_CONNECTIONS = 5;
/** fence-check's and finalize's SQS batch size (infra/queues.json); a batch's records run in parallel. */
export const DEPLOYED_BATCH_SIZE = 10;

export function lockVariants(scopes: number): LockVariant[] {
  const shared = scopes + 8;
  return [
    {
      id: VariantId.SPLIT_DEPLOYED_POOL,
      design: Design.SPLIT,
      connections: DEPLOYED_POOL_CONNECTIONS,
      label: `split, pool ${DEPLOYED_POOL_CONNECTIONS} (as deployed)`,
    },
    // The yardstick of the split's server-side hold: the same cleanups, pool and load, with the
    // floor's transactions (locks taken, row read or written, nothing decided).
    {
      id: VariantId.FLOOR_DEPLOYED_POOL,
      design: Design.FLOOR,
      connections: DEPLOYED_POOL_CONNECTIONS,
      label: `floor, pool ${DEPLOYED_POOL_CONNECTIONS} (no logic)`,
    },
    {
      id: VariantId.SPLIT_SAME_POOL,
      design: Design.SPLIT,
      connections: shared,
      label: `split, pool ${shared}`,
    },
    {
      id: VariantId.BASELINE,
      design: Design.BASELINE,
      connections: shared,
      label: `baseline, pool ${shared}`,
    },
    // An extra row, not a comparison: the same 32 cleanups, but no more in flight than one
    // deployed instance has (one batch), so a lock holder's next round trip is not queued behind
    // the callbacks of 31 other cleanups on this event loop.
    {
      id: VariantId.SPLIT_ONE_INSTANCE,
      design: Design.SPLIT,
      connections: DEPLOYED_POOL_CONNECTIONS,
      label: `split, pool ${DEPLOYED_POOL_CONNECTIONS}, ≤ ${DEPLOYED_BATCH_SIZE} cleanups in flight (one instance; extra)`,
      cleanupsInFlight: DEPLOYED_BATCH_SIZE,
    },
  ];
}

export interface LockScenarioProfile {
  scopes: number;
  leaseWorkers: number;
  leasePeriodMs: number;
  recoveryWorkers: number;
  recoveryPeriodMs: number;
  seed: number;
}

export interface LockFigure {
  variant: string;
  label: string;
  design: Design;
  /** Pool size of the cleanup transactions. */
  connections: number;
  deleteLatencyMs: number;
  valid: boolean;
  /** Why the figure was not reported (only when invalid). */
  error?: string;
  rounds: number;
  cleanups: number;
  /** Cleanups / the rounds' cleanup time (preparation excluded). */
  cleanupsPerSecond: number;
  cleanupMs: Summary;
  /** Every cleanup transaction (split: fence check and finalize; floor: its two; baseline: its one). */
  advisoryHoldMs: Summary;
  rowHoldMs: Summary;
  holdsByPhase: Record<
    string,
    {
      advisoryHoldMs: Summary;
      rowHoldMs: Summary;
      transactionMs: Summary;
      roundTripsUnderLock: number;
      serverHoldMs?: Summary;
      serverMessageMs?: Summary;
    }
  >;
  /**
   * Split and floor (one-trip transactions): the advisory-lock hold on the server's clock, from when
   * the decision took the scope's lock to just after its COMMIT (noted: bench/support/instrumented-functions.ts), and the server's
   * time on the whole message (lock waits included). Absent in results written before they were
   * measured.
   */
  serverHoldMs?: Summary;
  serverMessageMs?: Summary;
  /** Where the CPU went during the rounds' cleanup phases (weighted by their duration). */
  cpu: CpuReport;
  /** The contention-load process's own event loop and CPU while its load ran. */
  loadProcess: ProcessReport;
  leaseRenewalMs: Summary;
  leaseRenewalServiceMs: Summary;
  recoveryTransactionMs: Summary;
  recoveryTransactionServiceMs: Summary;
  /** Operations that waited longer than production's lock_timeout (5 s) and would have failed there. */
  overProductionLockTimeout: { leaseRenewals: number; recoveryTransactions: number };
  loadOperations: { leaseRenewals: number; recoveryTransactions: number };
}

interface RoundOutcome {
  cleanupMs: number[];
  seconds: number;
  lease: LoadResult;
  recovery: LoadResult;
  cpu: CpuReport;
  loadProcess: ProcessReport;
}

export interface LockScenarioContext {
  postgres: BenchPostgres;
  provisioner: LocalProvisioner;
  config: CleanupConfig;
  profile: LockScenarioProfile;
}

export async function runLockScenario(
  context: LockScenarioContext,
  variant: LockVariant,
  deleteLatencyMs: number,
  rounds: number,
): Promise<LockFigure> {
  const { postgres, provisioner } = context;
  const database = await postgres.createDatabase(`locks_${variant.id}_${deleteLatencyMs}`);
  const closers: Array<() => Promise<void> | void> = [];
  try {
    const round = await prepareRounds(context, variant, database, closers);
    provisioner.clearFaults();
    // One unmeasured round on this figure's own pool: PL/pgSQL plans each statement of a decision
    // function at its first run on a connection, under the locks; plain statements (the floor's)
    // are planned before the lock. Cold calls would sit in the split's tail and not the floor's.
    await round();
    round.holds.length = 0;
    if (deleteLatencyMs > 0) provisioner.setFault('*', { latencyMs: deleteLatencyMs });
    const outcomes: RoundOutcome[] = [];
    for (let index = 0; index < rounds; index += 1) outcomes.push(await round());
    return summarizeFigure(variant, deleteLatencyMs, outcomes, round.holds);
  } catch (error) {
    return invalidFigure(variant, deleteLatencyMs, describeError(error));
  } finally {
    provisioner.clearFaults();
    for (const close of closers.reverse()) await Promise.resolve(close()).catch(() => {});
    await database.drop();
  }
}

/**
 * Opens the pools (one per simulated process, as in production: the platform, the cleanups, the
 * lease reconciler and the recovery workers never share connections; the latter two live in the
 * load process), creates the scopes, and returns the function that runs one measured round.
 */
async function prepareRounds(
  context: LockScenarioContext,
  variant: LockVariant,
  database: BenchDatabase,
  closers: Array<() => Promise<void> | void>,
): Promise<(() => Promise<RoundOutcome>) & { holds: LockHoldSample[] }> {
  const { postgres, provisioner, config, profile } = context;
  const pools = {
    platform: { db: await database.open({ maxConnections: 8 }), connections: 8 },
    cleanup: {
      db: await database.open({ maxConnections: variant.connections }),
      connections: variant.connections,
    },
  };
  const warmAll = () => Promise.all(Object.values(pools).map((pool) => warmPool(pool.db, pool.connections)));
  // Started now, awaited after the scopes are created: its start-up (process, pools, JIT
  // warm-up) overlaps the set-up instead of adding to it. Nothing is measured until both are done.
  const loadStarting = startLoadProcess({
    url: database.url,
    wsProxy: postgres.wsProxy,
    leaseWorkers: profile.leaseWorkers,
    leasePeriodMs: profile.leasePeriodMs,
    recoveryWorkers: profile.recoveryWorkers,
    recoveryPeriodMs: profile.recoveryPeriodMs,
    seed: profile.seed,
  });
  // Handled here so a failed start is not an unhandled rejection while the scopes are created;
  // the `await` below still throws it.
  loadStarting.catch(() => {});
  closers.push(async () => (await loadStarting).close());
  // The simulator only needs queues to announce; nothing is announced here, so none is reached.
  const unusedQueues = createQueues({ endpoint: 'http://127.0.0.1:9' });
  closers.push(() => unusedQueues.client.destroy());
  const platform = new PlatformSimulator(pools.platform.db, unusedQueues, provisioner.url);
  const client = new ProvisionerClient(provisioner.url);
  closers.push(() => client.close());
  const provider = new SandboxProvider({
    client,
    releaseLockTimeoutMs: config.releaseLockTimeoutSeconds * 1000,
    provisionerDeleteTimeoutMs: config.provisionerDeleteTimeoutSeconds * 1000,
  });
  const holds: LockHoldSample[] = [];
  const cleanup = buildCleanup(variant.design, pools.cleanup.db, (sample) => holds.push(sample), {
    config,
    provider,
    client,
  });
  const inFlight = limitInFlight(variant.cleanupsInFlight);
  const scopes: ScopeRef[] = [];
  for (let i = 0; i < profile.scopes; i += 1) scopes.push(await platform.createScope(`bench-user-${i % 8}`));
  const load = await loadStarting;

  const round = async (): Promise<RoundOutcome> => {
    const runs = await admitAndFinish(platform, scopes);
    await waitForSandboxesReady(
      provisioner,
      runs.map((run) => run.sandboxId),
    );
    await warmAll();
    await load.start(
      runs.map((run) => ({ runId: run.runId, uid: run.scope.uid, runtimeScopeId: run.scope.runtimeScopeId })),
    );
    const cpu = await startCpuProbe({ bridgePid: postgres.bridgePid, databaseName: database.name });
    const started = performance.now();
    const results = await Promise.allSettled(
      runs.map((run) => inFlight(() => timed(() => cleanup(run.runId)))),
    );
    const seconds = (performance.now() - started) / 1000;
    // The load is told to stop first, at once: samples taken after the cleanups ended would be
    // uncontended ones diluting the tail.
    const [loadReport, cpuReport] = await Promise.all([load.stop(), cpu.stop()]);
    const { lease: leaseResult, recovery: recoveryResult, process: loadProcess } = loadReport;

    const failures = results.flatMap((result, index) =>
      result.status === 'rejected' ? [`${runs[index]!.runId}: ${describeError(result.reason)}`] : [],
    );
    if (failures.length) throw new Error(`${failures.length} cleanups failed, e.g. ${failures[0]}`);
    const loadErrors = [...leaseResult.errors, ...recoveryResult.errors];
    if (loadErrors.length)
      throw new Error(`${loadErrors.length} load operations failed, e.g. ${loadErrors[0]}`);
    await assertConverged(pools.platform.db, provisioner, runs);
    return {
      cleanupMs: results.map((result) => (result as PromiseFulfilledResult<number>).value),
      seconds,
      lease: leaseResult,
      recovery: recoveryResult,
      cpu: cpuReport,
      loadProcess,
    };
  };
  return Object.assign(round, { holds });
}

type Cleanup = (runId: string) => Promise<void>;

function buildCleanup(
  design: Design,
  db: PooledDatabase,
  record: (sample: LockHoldSample) => void,
  parts: { config: CleanupConfig; provider: SandboxProvider; client: ProvisionerClient },
): Cleanup {
  if (design === Design.BASELINE) {
    const baselineDb = withLockHoldProbe(db, 'baseline', record);
    return async (runId) => {
      const result = await cleanupWithDeleteInsideTransaction(baselineDb, runId, {
        client: parts.client,
        provisionerDeleteTimeoutMs: parts.config.provisionerDeleteTimeoutSeconds * 1000,
      });
      if (result.outcome !== BaselineOutcome.CLEARED || result.releaseOutcome !== ReleaseOutcome.DELETED) {
        throw new Error(`baseline cleanup ended ${result.outcome}/${result.releaseOutcome ?? 'no delete'}`);
      }
    };
  }
  if (design === Design.FLOOR) {
    const checkDb = withLockHoldProbe(db, 'floor check', record);
    const clearDb = withLockHoldProbe(db, 'floor clear', record);
    return async (runId) => {
      const target = await floorCheck(checkDb, runId);
      const deleted = await parts.client.deleteSandbox({
        sandboxId: target.sandboxId,
        generation: Number(target.generation),
        deleteTimeoutMs: parts.config.provisionerDeleteTimeoutSeconds * 1000,
      });
      if (deleted !== ReleaseOutcome.DELETED) throw new Error(`floor delete ended ${deleted}`);
      await floorClear(clearDb, target);
    };
  }
  const fenceDb = withLockHoldProbe(db, 'fence-check', record);
  const finalizeDb = withLockHoldProbe(db, 'finalize', record);
  return async (runId) => {
    const checked = await fenceCheck(fenceDb, runId);
    if (checked.outcome !== FenceCheckOutcome.RELEASE_NEEDED) {
      throw new Error(`fence check ended ${checked.outcome}, expected ${FenceCheckOutcome.RELEASE_NEEDED}`);
    }
    const released = await release(checked.identity, {
      provider: parts.provider,
      runtimeCleanupTimeoutMs: parts.config.runtimeCleanupTimeoutSeconds * 1000,
    });
    if (released.outcome !== ReleaseOutcome.DELETED) throw new Error(`release ended ${released.outcome}`);
    const finalized = await finalize(finalizeDb, checked.identity);
    if (finalized.outcome !== FinalizeOutcome.CLEARED) {
      throw new Error(`finalize ended ${finalized.outcome}, expected ${FinalizeOutcome.CLEARED}`);
    }
  };
}

async function timed(work: () => Promise<void>): Promise<number> {
  const started = performance.now();
  await work();
  return performance.now() - started;
}

function holdSummaries(samples: readonly LockHoldSample[]) {
  const roundTrips = samples.reduce((sum, s) => sum + s.roundTripsUnderLock, 0);
  return {
    advisoryHoldMs: summarize(samples.flatMap((s) => (s.advisoryMs === null ? [] : [s.advisoryMs]))),
    rowHoldMs: summarize(samples.flatMap((s) => (s.rowMs === null ? [] : [s.rowMs]))),
    transactionMs: summarize(samples.map((s) => s.transactionMs)),
    roundTripsUnderLock: samples.length ? Math.round((roundTrips / samples.length) * 100) / 100 : 0,
    serverHoldMs: summarize(samples.flatMap((s) => (s.serverHeldMs === null ? [] : [s.serverHeldMs]))),
    serverMessageMs: summarize(
      samples.flatMap((s) => (s.serverMessageMs === null ? [] : [s.serverMessageMs])),
    ),
  };
}

function summarizeFigure(
  variant: LockVariant,
  deleteLatencyMs: number,
  outcomes: readonly RoundOutcome[],
  holds: readonly LockHoldSample[],
): LockFigure {
  const cleanupMs = outcomes.flatMap((o) => o.cleanupMs);
  const seconds = outcomes.reduce((sum, o) => sum + o.seconds, 0);
  const lease = outcomes.flatMap((o) => o.lease.latenciesMs);
  const recovery = outcomes.flatMap((o) => o.recovery.latenciesMs);
  const phases = [...new Set(holds.map((h) => h.phase))];
  const all = holdSummaries(holds);
  return {
    variant: variant.id,
    label: variant.label,
    design: variant.design,
    connections: variant.connections,
    deleteLatencyMs,
    valid: true,
    rounds: outcomes.length,
    cleanups: cleanupMs.length,
    cleanupsPerSecond: Math.round((cleanupMs.length / seconds) * 10) / 10,
    cleanupMs: summarize(cleanupMs),
    cpu: mergeCpuReports(outcomes.map((o) => o.cpu)),
    loadProcess: mergeProcessReports(outcomes.map((o) => o.loadProcess)),
    advisoryHoldMs: all.advisoryHoldMs,
    rowHoldMs: all.rowHoldMs,
    ...(holds.some((h) => h.serverHeldMs !== null)
      ? { serverHoldMs: all.serverHoldMs, serverMessageMs: all.serverMessageMs }
      : {}),
    holdsByPhase: Object.fromEntries(
      phases.map((phase) => [phase, holdSummaries(holds.filter((h) => h.phase === phase))]),
    ),
    leaseRenewalMs: summarize(lease),
    leaseRenewalServiceMs: summarize(outcomes.flatMap((o) => o.lease.serviceMs)),
    recoveryTransactionMs: summarize(recovery),
    recoveryTransactionServiceMs: summarize(outcomes.flatMap((o) => o.recovery.serviceMs)),
    overProductionLockTimeout: {
      leaseRenewals: outcomes
        .flatMap((o) => o.lease.serviceMs)
        .filter((ms) => ms > PRODUCTION_LOCK_TIMEOUT_MS).length,
      recoveryTransactions: outcomes
        .flatMap((o) => o.recovery.serviceMs)
        .filter((ms) => ms > PRODUCTION_LOCK_TIMEOUT_MS).length,
    },
    loadOperations: {
      leaseRenewals: outcomes.reduce((sum, o) => sum + o.lease.operations, 0),
      recoveryTransactions: outcomes.reduce((sum, o) => sum + o.recovery.operations, 0),
    },
  };
}

function invalidFigure(variant: LockVariant, deleteLatencyMs: number, error: string): LockFigure {
  const empty = summarize([]);
  return {
    variant: variant.id,
    label: variant.label,
    design: variant.design,
    connections: variant.connections,
    deleteLatencyMs,
    valid: false,
    error,
    rounds: 0,
    cleanups: 0,
    cleanupsPerSecond: 0,
    cleanupMs: empty,
    cpu: mergeCpuReports([]),
    loadProcess: mergeProcessReports([]),
    advisoryHoldMs: empty,
    rowHoldMs: empty,
    holdsByPhase: {},
    leaseRenewalMs: empty,
    leaseRenewalServiceMs: empty,
    recoveryTransactionMs: empty,
    recoveryTransactionServiceMs: empty,
    overProductionLockTimeout: { leaseRenewals: 0, recoveryTransactions: 0 },
    loadOperations: { leaseRenewals: 0, recoveryTransactions: 0 },
  };
}
