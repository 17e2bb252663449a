import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { ProvisionerClient } from '../../functions/cleanup/provisioner-client.ts';
import { release } from '../../functions/cleanup/release.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import { FenceCheckOutcome, FinalizeOutcome, ReleaseOutcome } from '../../functions/cleanup/types.ts';
import type { CleanupConfig } from '../../functions/platform/config.ts';
import type { Database } from '../../functions/platform/database.ts';
import { createQueues } from '../../functions/platform/queues.ts';
import { PlatformSimulator, type ScopeRef } from '../../infra/local/platform.ts';
import { seededRandom } from '../../infra/local/provisioner/faults.ts';
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import {
  BaselineOutcome,
  cleanupWithDeleteInsideTransaction,
} from '../baseline/delete-inside-transaction.ts';
import { admitAndFinish, assertConverged, describeError } from '../support/convergence.ts';
import { type CpuReport, mergeCpuReports, startCpuProbe } from '../support/cpu.ts';
import { type LockHoldSample, withLockHoldProbe } from '../support/lock-hold.ts';
import {
  type BenchDatabase,
  type BenchPostgres,
  PRODUCTION_LOCK_TIMEOUT_MS,
  warmPool,
} from '../support/postgres.ts';
import { waitForSandboxesReady } from '../support/sandboxes.ts';
import { type Summary, summarize } from '../support/stats.ts';
import { type LoadResult, recoveryTransaction, renewLease, startLoad } from './contention-load.ts';

/**
 * Part 1: lock hold and contention against delete latency, one design at a time.
 *
 * Each round admits one root run in each of `scopes` scopes the way the platform does (scope lock,
 * `runtime_cleanup_blocked`, a real sandbox process at the provisioner), finishes it (fence up),
 * waits for the sandboxes to boot, then starts the contention load (lease renewals and recovery
 * transactions on those very runs and scopes) and all the cleanups at once. The round ends when
 * every cleanup has returned; the load is stopped then, its in-flight operations awaited. A round
 * counts only if every cleanup cleared its fence and its sandbox generation was really deleted.
 *
 * The split design runs its three phases in-process (fence check, release, finalize), without the
 * queues between them: this part isolates what the database sees. Part 2 adds the queues.
 */
export const Design = { SPLIT: 'split', BASELINE: 'baseline' } as const;
export type Design = (typeof Design)[keyof typeof Design];

/**
 * A design run with a given pool of connections for its cleanup transactions. The baseline needs a
 * connection per cleanup in flight (it holds one across the delete); the split protocol holds one
 * only for its two short transactions, so it is measured both with the baseline's pool and with
 * the pool a deployed function has (5, functions/platform/dependencies.ts).
 */
export interface LockVariant {
  id: string;
  design: Design;
  connections: number;
  label: string;
}

export const VariantId = {
  SPLIT_DEPLOYED_POOL: 'split-deployed-pool',
  SPLIT_SAME_POOL: 'split',
  BASELINE: 'baseline',
} as const;

/** The deployed functions' pool size (functions/platform/dependencies.ts). */
export const DEPLOYED_POOL_CONNECTIONS = 5;

export function lockVariants(scopes: number): LockVariant[] {
  const shared = scopes + 8;
  return [
    {
      id: VariantId.SPLIT_DEPLOYED_POOL,
      design: Design.SPLIT,
      connections: DEPLOYED_POOL_CONNECTIONS,
      label: `split, pool ${DEPLOYED_POOL_CONNECTIONS} (as deployed)`,
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
  /** Every cleanup transaction (split: fence check and finalize; baseline: its one transaction). */
  advisoryHoldMs: Summary;
  rowHoldMs: Summary;
  holdsByPhase: Record<
    string,
    { advisoryHoldMs: Summary; rowHoldMs: Summary; transactionMs: Summary; roundTripsUnderLock: number }
  >;
  /** Where the CPU went during the rounds' cleanup phases (weighted by their duration). */
  cpu: CpuReport;
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
 * lease reconciler and the recovery workers never share connections), creates the scopes, and
 * returns the function that runs one measured round.
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
    lease: {
      db: await database.open({ maxConnections: profile.leaseWorkers }),
      connections: profile.leaseWorkers,
    },
    recovery: {
      db: await database.open({ maxConnections: profile.recoveryWorkers }),
      connections: profile.recoveryWorkers,
    },
  };
  const warmAll = () => Promise.all(Object.values(pools).map((pool) => warmPool(pool.db, pool.connections)));
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
  const random = seededRandom(profile.seed);
  const scopes: ScopeRef[] = [];
  for (let i = 0; i < profile.scopes; i += 1) scopes.push(await platform.createScope(`bench-user-${i % 8}`));

  const round = async (): Promise<RoundOutcome> => {
    const runs = await admitAndFinish(platform, scopes);
    await waitForSandboxesReady(
      provisioner,
      runs.map((run) => run.sandboxId),
    );
    await warmAll();
    const targets = runs.map((run) => ({
      runId: run.runId,
      uid: run.scope.uid,
      runtimeScopeId: run.scope.runtimeScopeId,
    }));
    const lease = startLoad({
      workers: profile.leaseWorkers,
      periodMs: profile.leasePeriodMs,
      random,
      targets: () => targets,
      operation: renewLease(pools.lease.db),
    });
    const recovery = startLoad({
      workers: profile.recoveryWorkers,
      periodMs: profile.recoveryPeriodMs,
      random,
      targets: () => targets,
      operation: recoveryTransaction(pools.recovery.db),
    });
    const cpu = await startCpuProbe({ bridgePid: postgres.bridgePid, databaseName: database.name });
    const started = performance.now();
    const results = await Promise.allSettled(runs.map((run) => timed(() => cleanup(run.runId))));
    const seconds = (performance.now() - started) / 1000;
    const [leaseResult, recoveryResult] = await Promise.all([lease.stop(), recovery.stop()]);
    const cpuReport = await cpu.stop();

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
    };
  };
  return Object.assign(round, { holds });
}

type Cleanup = (runId: string) => Promise<void>;

function buildCleanup(
  design: Design,
  db: Database,
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
    advisoryHoldMs: all.advisoryHoldMs,
    rowHoldMs: all.rowHoldMs,
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
