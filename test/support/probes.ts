/**
 * Probes for the acceptance tests of the cleanup protocol: hold a phase's transaction open on
 * purpose, look at its locks from another connection, and build runs whose sandbox really exists
 * at the local provisioner (a process and a directory), so a claim about "the delete" is a claim
 * about a real delete.
 */
import { access } from 'node:fs/promises';
import pg from 'pg';
import { expect } from 'vitest';
import { type Database, type Executor, SQLSTATE } from '../../functions/adapters/database.ts';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import {
  type CleanupIdentity,
  FenceCheckOutcome,
  type FenceCheckResult,
} from '../../functions/cleanup/types.ts';
import type { AuditEntry, LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import { finishedRootRun, type Scenario, upsertSandbox } from './factories.ts';

// --- Holding a phase's transaction open -------------------------------------------------------

/** A Database whose next transaction stops after its work, before COMMIT, until `resume()`. */
export interface PausingDatabase extends Database {
  /** Resolves once a transaction has done all its statements and waits to commit, locks held. */
  readonly paused: Promise<void>;
  /** Lets the held transaction (and every later one) commit. */
  resume(): void;
}

/**
 * Wraps `db` so that a phase run on it (fenceCheck, finalize) takes all its locks, runs all its
 * statements and then waits before committing (its one-round-trip transaction is sent as an
 * ordinary one for that). Pausing after the work rather than inside it keeps
 * the phase's own code untouched: whatever locks it takes are still held at that point, because a
 * transaction's row and advisory-xact locks last until COMMIT. This is the negative control of the
 * lock-freedom claim: it shows the probes below do see those locks when they are held.
 */
export function pausingDatabase(db: Database): PausingDatabase {
  let markPaused: () => void = () => {};
  let resume: () => void = () => {};
  const paused = new Promise<void>((resolve) => {
    markPaused = resolve;
  });
  const resumed = new Promise<void>((resolve) => {
    resume = resolve;
  });
  return {
    paused,
    resume,
    get stats() {
      return db.stats;
    },
    query: (text, values) => db.query(text, values),
    queryOnce: (text, values) => db.queryOnce(text, values),
    withTransaction<T>(work: (tx: Executor) => Promise<T>): Promise<T> {
      return db.withTransaction(async (tx) => {
        const result = await work(tx);
        markPaused();
        await resumed;
        return result;
      });
    },
    // A phase's one-round-trip transaction, sent as an ordinary transaction here (the statement,
    // then a pause, then COMMIT), so that its locks can be looked at while they are held.
    transact<Row>(text: string, values?: readonly unknown[]) {
      return db.withTransaction(async (tx) => {
        const result = await tx.query<Row>(text, values);
        markPaused();
        await resumed;
        return result;
      });
    },
    end: () => db.end(),
  };
}

// --- Looking at the cleanup's locks from another connection -----------------------------------

const LOCK_RUN_ROW_NOWAIT = 'SELECT 1 FROM agent_runs WHERE id = $1::text FOR UPDATE NOWAIT';
const TRY_SCOPE_LOCK =
  'SELECT pg_try_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text)) AS acquired';
/** Advisory locks held by anyone in this database (pg_locks is cluster-wide, hence the filter). */
const ADVISORY_LOCKS_IN_DATABASE = `
  SELECT count(*)::int AS held FROM pg_locks
  WHERE locktype = 'advisory' AND granted
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`;
/** Sessions of this database parked inside an open transaction, other than the asking one. */
const OPEN_TRANSACTIONS_IN_DATABASE = `
  SELECT count(*)::int AS open FROM pg_stat_activity
  WHERE datname = current_database() AND backend_type = 'client backend'
    AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`;

export type LockState = 'free' | 'held';

export interface CleanupLockProbe {
  /** `SELECT … FOR UPDATE NOWAIT` on the run's row: free if it succeeds, held if it raises 55P03. */
  rowLock: LockState;
  /** `pg_try_advisory_xact_lock(runtime_cleanup_lock_key(uid, scope))`: free if it returns true. */
  scopeLock: LockState;
}

/**
 * Tries, from `other` (an independent pool: another process as far as PostgreSQL can tell), to
 * take the very locks the cleanup phases take, without waiting: what a same-scope recovery
 * transaction or the lease reconciler would need. Each try runs in its own transaction and is
 * rolled back or committed at once, so the probe itself holds nothing afterwards.
 */
export async function probeCleanupLocks(
  other: Database,
  target: Pick<Scenario, 'rootRunId' | 'uid' | 'runtimeScopeId'>,
): Promise<CleanupLockProbe> {
  const rowLock = await other
    .withTransaction(async (tx) => {
      const { rowCount } = await tx.query(LOCK_RUN_ROW_NOWAIT, [target.rootRunId]);
      // A probe of a missing row would report "free" for the wrong reason.
      if (rowCount !== 1) throw new Error(`probe: run ${target.rootRunId} does not exist`);
      return 'free' as const;
    })
    .catch((error: unknown) => {
      if ((error as { details?: { sqlstate?: string } }).details?.sqlstate === SQLSTATE.LOCK_NOT_AVAILABLE) {
        return 'held' as const;
      }
      throw error;
    });
  const scopeLock = await other.withTransaction(async (tx) => {
    const { rows } = await tx.query<{ acquired: boolean }>(TRY_SCOPE_LOCK, [
      target.uid,
      target.runtimeScopeId,
    ]);
    return rows[0]!.acquired ? ('free' as const) : ('held' as const);
  });
  return { rowLock, scopeLock };
}

const TAKE_SCOPE_LOCK = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';

/**
 * Takes the scope's advisory lock in a transaction on `db` and keeps it, as a running cleanup
 * transaction would, until `release()` commits that transaction.
 */
export async function holdScopeAdvisoryLock(
  db: Database,
  target: Pick<Scenario, 'uid' | 'runtimeScopeId'>,
): Promise<{ release(): Promise<void> }> {
  let release!: () => void;
  let locked!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const lockTaken = new Promise<void>((resolve) => (locked = resolve));
  const holder = db.withTransaction(async (tx) => {
    await tx.query(TAKE_SCOPE_LOCK, [target.uid, target.runtimeScopeId]);
    locked();
    await released;
  });
  await lockTaken;
  return {
    release: async () => {
      release();
      await holder;
    },
  };
}

/**
 * The same lock, held on a session of its own with no bounds: for a test whose other side is a
 * child process (a CLI, started through npm and tsx before the tests ran command bundles), which on
 * a loaded machine has taken 38 s to start, longer than the adapter's transaction and idle-in-transaction timeouts, after which the
 * server ended the holder and the child found the scope free.
 */
export async function holdScopeAdvisoryLockUnbounded(
  url: string,
  target: Pick<Scenario, 'uid' | 'runtimeScopeId'>,
): Promise<{ release(): Promise<void> }> {
  const session = new pg.Client({ connectionString: url });
  await session.connect();
  try {
    await session.query('BEGIN');
    await session.query(TAKE_SCOPE_LOCK, [target.uid, target.runtimeScopeId]);
  } catch (error) {
    await session.end().catch(() => {});
    throw error;
  }
  return {
    release: async () => {
      try {
        await session.query('COMMIT');
      } finally {
        await session.end();
      }
    },
  };
}

/** Everything PostgreSQL can say about locks and transactions in this database right now. */
export async function databaseActivity(
  other: Executor,
): Promise<{ advisoryLocks: number; openTransactions: number }> {
  // One after the other: two queries at once would each see the other's transaction.
  const locks = await other.query<{ held: number }>(ADVISORY_LOCKS_IN_DATABASE);
  const transactions = await other.query<{ open: number }>(OPEN_TRANSACTIONS_IN_DATABASE);
  return { advisoryLocks: locks.rows[0]!.held, openTransactions: transactions.rows[0]!.open };
}

// --- Runs whose sandbox really exists -----------------------------------------------------------

export interface ProvisionedRun extends Scenario {
  /** The sandbox's process and work directory at the provisioner. */
  pid: number;
  dir: string;
}

/** Creates (or finds) a sandbox at the provisioner over its HTTP API; returns its generation. */
export async function createSandboxAt(
  provisionerUrl: string,
  body: { sandboxId: string; threadId: string; uid: string },
  token?: string,
): Promise<number> {
  const response = await fetch(new URL('/api/sandboxes', provisionerUrl), {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(token !== undefined ? { authorization: `Bearer ${token}` } : {}),
    },
    body: JSON.stringify({ sandbox_id: body.sandboxId, thread_id: body.threadId, user_id: body.uid }),
  });
  if (response.status !== 200 && response.status !== 201) {
    throw new Error(
      `provisioner refused sandbox ${body.sandboxId}: ${response.status} ${await response.text()}`,
    );
  }
  return ((await response.json()) as { generation: number }).generation;
}

/**
 * A terminal root run with its fence up, as the platform leaves it, whose scope's sandbox was
 * created for real at the provisioner and its generation recorded in `sandbox_runtimes`.
 */
export async function provisionedRootRun(
  db: Executor,
  provisioner: LocalProvisioner,
): Promise<ProvisionedRun> {
  const run = await finishedRootRun(db, { withSandbox: false });
  const sandboxId = `sbx-${run.runtimeScopeId}`;
  const generation = await createSandboxAt(provisioner.url, {
    sandboxId,
    threadId: run.threadId,
    uid: run.uid,
  });
  await upsertSandbox(db, { uid: run.uid, runtimeScopeId: run.runtimeScopeId, sandboxId, generation });
  const sandbox = provisioner.sandbox(sandboxId);
  if (!sandbox) throw new Error(`sandbox ${sandboxId} is not live after creation`);
  return { ...run, sandboxId, generation, pid: sandbox.pid, dir: sandbox.dir };
}

/** The identity phase 1 resolved, asserting that it asks for a release. */
export function releaseNeeded(result: FenceCheckResult): CleanupIdentity {
  expect(result.outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
  if (result.outcome !== FenceCheckOutcome.RELEASE_NEEDED) throw new Error('unreachable');
  return result.identity;
}

// --- The provider, and what the provisioner saw ---------------------------------------------------

export interface TestProvider {
  provider: SandboxProvider;
  client: ProvisionerClient;
}

/** A provider over a real HTTP client; close `client` when done (it keeps sockets alive). */
export function testProvider(
  provisionerUrl: string,
  timeouts: { releaseLockTimeoutMs?: number; provisionerDeleteTimeoutMs?: number } = {},
): TestProvider {
  const client = new ProvisionerClient(provisionerUrl);
  const provider = new SandboxProvider({
    client,
    releaseLockTimeoutMs: timeouts.releaseLockTimeoutMs ?? 5_000,
    provisionerDeleteTimeoutMs: timeouts.provisionerDeleteTimeoutMs ?? 5_000,
  });
  return { provider, client };
}

export function isDeleteOf(sandboxId: string): (entry: AuditEntry) => boolean {
  return (entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId;
}

export function deletesOf(provisioner: LocalProvisioner, sandboxId: string): AuditEntry[] {
  return provisioner.audit().filter(isDeleteOf(sandboxId));
}

export async function pathExists(path: string): Promise<boolean> {
  return access(path).then(
    () => true,
    () => false,
  );
}

/** The error a promise rejects with; fails the test if it resolves instead. */
export async function rejectionOf(promise: Promise<unknown>): Promise<unknown> {
  let value: unknown;
  try {
    value = await promise;
  } catch (error) {
    return error;
  }
  throw new Error(`expected a rejection, got ${JSON.stringify(value)}`);
}
