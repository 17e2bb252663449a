/**
 * What the agent platform does around a cleanup, done the way the platform would do it: admit a
 * root run only while `runtime_cleanup_blocked` says the scope is free (under the scope's advisory
 * lock), acquire the scope's sandbox from the provisioner, and on finishing set the fence in the
 * same transaction as the terminal status, then announce the run on `run-finished`.
 *
 * Used by the demo workload, the chaos suite, the benchmarks and end-to-end tests.
 */
import { randomUUID } from 'node:crypto';
import type { Database, Executor } from '../../functions/adapters/database.ts';
import { announceRunFinished } from '../../functions/adapters/publish.ts';
import type { Queues } from '../../functions/adapters/queues.ts';

export interface ScopeRef {
  uid: string;
  runtimeScopeId: string;
  threadId: string;
  conversationId: number;
  workdirPath: string;
}

export interface AdmittedRun {
  runId: string;
  scope: ScopeRef;
  sandboxId: string;
  generation: number;
}

/**
 * The scope's advisory lock is taken in its own statement: in READ COMMITTED a statement's snapshot
 * is taken when it starts, so a lock taken inside the INSERT would check the fence as it was
 * before the lock was granted.
 */
const LOCK_SCOPE = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';

const ADMIT_ROOT_RUN = `
  INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, run_type, status,
                          worker_id, heartbeat_at, lease_expires_at)
  SELECT $1::text, $2::text, $3::bigint, $4::text, $5::text, $6::text, 'running', $7::text, now(), now() + interval '30 seconds'
  WHERE NOT runtime_cleanup_blocked($2::text, $5::text)
  RETURNING id`;

const RECORD_SANDBOX = `
  INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
  VALUES ($1::text, $2::text, $3::text, $4::bigint)
  ON CONFLICT (uid, runtime_scope_id)
  DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = EXCLUDED.generation, released_at = NULL`;

/**
 * The same record as a sloppy platform integration writes it: an upsert that names the new
 * sandbox id and generation and leaves `released_at` alone (the chaos suite's
 * `platform.new_generation_upsert_keeps_released_at`). The database must reset it (migration 005).
 */
const RECORD_SANDBOX_KEEPING_RELEASED = `
  INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
  VALUES ($1::text, $2::text, $3::text, $4::bigint)
  ON CONFLICT (uid, runtime_scope_id)
  DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = EXCLUDED.generation`;

const FINISH_RUN = `
  UPDATE agent_runs
  SET status = $2::text, finished_at = now(), updated_at = now(), worker_id = NULL, lease_expires_at = NULL,
      runtime_cleanup_pending = (run_type <> 'subagent')
  WHERE id = $1::text AND status IN ('pending', 'running', 'cancel_requested')
  RETURNING runtime_cleanup_pending`;

const RENEW_LEASE = `
  UPDATE agent_runs SET heartbeat_at = now(), lease_expires_at = now() + interval '30 seconds', updated_at = now()
  WHERE id = $1::text AND status IN ('pending', 'running', 'cancel_requested')`;

/**
 * How the platform records a sandbox: as the contract asks, leaving `released_at` alone, or
 * leaving it alone as a logical-replication apply or a restore with triggers disabled writes it
 * (`session_replication_role = replica`: ordinary triggers do not fire).
 */
export type SandboxUpsert = 'resets-released' | 'keeps-released' | 'keeps-released-bypassing-triggers';

/** The scope's next generation, for a provisioner that reports none (the platform's counts its own). */
const NEXT_GENERATION = `
  SELECT COALESCE(max(generation), 0) + 1 AS generation FROM sandbox_runtimes
  WHERE uid = $1::text AND runtime_scope_id = $2::text`;

export class PlatformSimulator {
  /**
   * `provisionerUrl` is the provisioner's base URL, a path prefix included (a provisioner behind a
   * gateway route); `token`, when given, goes on every request as `Authorization: Bearer <token>`.
   */
  constructor(
    private readonly db: Database,
    private readonly queues: Queues,
    private readonly provisionerUrl: string,
    private readonly options: { token?: string | undefined } = {},
  ) {}

  async createScope(uid = `user-${randomUUID().slice(0, 8)}`): Promise<ScopeRef> {
    const threadId = `thread-${randomUUID()}`;
    const workdirPath = `projects/${randomUUID()}`;
    // Sent once: repeated after a lost answer, it would make a second conversation.
    const { rows } = await this.db.queryOnce<{ id: string }>(
      'INSERT INTO conversations (uid, thread_id, workdir_path) VALUES ($1::text, $2::text, $3::text) RETURNING id',
      [uid, threadId, workdirPath],
    );
    return {
      uid,
      runtimeScopeId: `scope-${threadId.slice(7, 19)}`,
      threadId,
      conversationId: Number(rows[0]!.id),
      workdirPath,
    };
  }

  /**
   * Admits a root run if the scope is not fenced; returns undefined when blocked.
   *
   * `crashBeforeRecording` (the demo's and the chaos suite's leak injection, issue 13): the
   * platform creates a sandbox under a fresh id, crashes before recording it, and on restart
   * acquires the scope's sandbox as usual. The first sandbox is live at the provisioner and named
   * by no row: a leak only the reclaimer can find. Its id is returned as `leakedSandboxId`.
   */
  async admitRootRun(
    scope: ScopeRef,
    options: {
      runType?: 'chat' | 'resume';
      workerId?: string;
      upsert?: SandboxUpsert;
      crashBeforeRecording?: boolean;
      /**
       * Record this sandbox instead of creating one at the provisioner (the smoke check against a
       * stage whose provisioner this machine cannot reach: the release's DELETE then finds it gone).
       */
      recordedSandbox?: { sandboxId: string; generation: number };
      /**
       * Awaited inside the admission's transaction, after its insert, before its commit: the scope's
       * lock is held meanwhile (the chaos suite holds it while the reclaim guard waits for it).
       */
      beforeCommit?: () => Promise<void>;
    } = {},
  ): Promise<(AdmittedRun & { leakedSandboxId?: string }) | undefined> {
    const runId = `run-${randomUUID()}`;
    const admitted = await this.db.withTransaction(async (tx) => {
      await tx.query(LOCK_SCOPE, [scope.uid, scope.runtimeScopeId]);
      const { rows } = await tx.query(ADMIT_ROOT_RUN, [
        runId,
        scope.uid,
        scope.conversationId,
        scope.threadId,
        scope.runtimeScopeId,
        options.runType ?? 'chat',
        options.workerId ?? 'worker-1',
      ]);
      await options.beforeCommit?.();
      return rows.length === 1;
    });
    if (!admitted) return undefined;
    let leakedSandboxId: string | undefined;
    if (options.crashBeforeRecording) {
      leakedSandboxId = `sbx-${scope.runtimeScopeId}-lost-${randomUUID().slice(0, 8)}`;
      await this.#createAtProvisioner(scope, leakedSandboxId);
    }
    const sandbox = options.recordedSandbox
      ? await this.recordSandbox(scope, options.recordedSandbox, options.upsert)
      : await this.acquireSandbox(scope, options.upsert);
    return { runId, scope, ...sandbox, ...(leakedSandboxId ? { leakedSandboxId } : {}) };
  }

  /** Creates (or reuses) the scope's sandbox at the provisioner and records its generation. */
  async acquireSandbox(
    scope: ScopeRef,
    upsert: SandboxUpsert = 'resets-released',
  ): Promise<{ sandboxId: string; generation: number }> {
    const sandboxId = `sbx-${scope.runtimeScopeId}`;
    const generation = await this.#createAtProvisioner(scope, sandboxId);
    return this.recordSandbox(scope, { sandboxId, generation }, upsert);
  }

  /** Records the scope's sandbox and generation, as the platform does once the provisioner made it. */
  async recordSandbox(
    scope: ScopeRef,
    sandbox: { sandboxId: string; generation: number },
    upsert: SandboxUpsert = 'resets-released',
  ): Promise<{ sandboxId: string; generation: number }> {
    const { sandboxId, generation } = sandbox;
    // An upsert: the same row whether it runs once or twice.
    const values = [scope.uid, scope.runtimeScopeId, sandboxId, generation];
    if (upsert === 'keeps-released-bypassing-triggers') {
      await this.db.withTransaction(async (tx) => {
        await tx.query("SET LOCAL session_replication_role = 'replica'");
        await tx.query(RECORD_SANDBOX_KEEPING_RELEASED, values);
      });
    } else {
      // In a READ COMMITTED transaction of its own, as docs/integration.md asks of a platform's
      // record: the trigger that refuses a sandbox being reclaimed raises 25000 in any other level,
      // so a plain statement failed on a database whose default is REPEATABLE READ (the chaos
      // suite's db.repeatable_read_default: admitted runs left running with no sandbox recorded).
      // An upsert, so the one repeat after a lost connection writes the same row.
      await this.db.transact(
        upsert === 'resets-released' ? RECORD_SANDBOX : RECORD_SANDBOX_KEEPING_RELEASED,
        values,
      );
    }
    return { sandboxId, generation };
  }

  /**
   * POST /api/sandboxes: creates (or reuses) the sandbox; returns its generation: the one the
   * provisioner reports, or, from a provisioner that reports none (the platform's), the scope's
   * next one, as the platform counts them itself.
   */
  async #createAtProvisioner(scope: ScopeRef, sandboxId: string): Promise<number> {
    const base = this.provisionerUrl.replace(/\/+$/, '');
    const { token } = this.options;
    const response = await fetch(`${base}/api/sandboxes`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(token !== undefined ? { authorization: `Bearer ${token}` } : {}),
      },
      body: JSON.stringify({ sandbox_id: sandboxId, thread_id: scope.threadId, user_id: scope.uid }),
    });
    if (response.status !== 200 && response.status !== 201) {
      throw new Error(
        `provisioner refused to create sandbox ${sandboxId}: ${response.status} ${await response.text()}`,
      );
    }
    const body = (await response.json()) as { generation?: unknown };
    if (typeof body.generation === 'number') return body.generation;
    const { rows } = await this.db.query<{ generation: string }>(NEXT_GENERATION, [
      scope.uid,
      scope.runtimeScopeId,
    ]);
    return Number(rows[0]!.generation);
  }

  async startSubagent(parent: AdmittedRun): Promise<string> {
    const runId = `run-${randomUUID()}`;
    // Sent once: repeated after a lost commit, it would fail on its own primary key.
    await this.db.queryOnce(
      `INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, run_type,
         created_by_run_id, status, worker_id, heartbeat_at, lease_expires_at)
       VALUES ($1::text, $2::text, $3::bigint, $4::text, $5::text, 'subagent', $6::text, 'running', 'worker-1', now(),
         now() + interval '30 seconds')`,
      [
        runId,
        parent.scope.uid,
        parent.scope.conversationId,
        parent.scope.threadId,
        parent.scope.runtimeScopeId,
        parent.runId,
      ],
    );
    return runId;
  }

  /** Renews a run's lease the way a worker's heartbeat does; returns how long it took (ms). */
  async renewLease(runId: string): Promise<number> {
    const started = performance.now();
    // Idempotent within the lease: a repeat only moves the heartbeat forward.
    await this.db.query(RENEW_LEASE, [runId]);
    return performance.now() - started;
  }

  /**
   * Ends a run: terminal status and (for a root run) the fence in one statement, then the
   * announcement. Returns whether a fence was set.
   */
  async finishRun(
    runId: string,
    /** One of TERMINAL_RUN_STATUSES (infra/run-statuses.ts). */
    status = 'completed',
    options: { announce?: boolean } = {},
  ): Promise<boolean> {
    // Sent once: repeated after a lost commit, it would find the run terminal already and skip the
    // announcement (the sweeper would still find the fence, FENCE_SWEEP_AFTER_SECONDS later).
    const { rows } = await this.db.queryOnce<{ runtime_cleanup_pending: boolean }>(FINISH_RUN, [
      runId,
      status,
    ]);
    const fenced = rows[0]?.runtime_cleanup_pending ?? false;
    if (fenced && options.announce !== false) await announceRunFinished(this.queues, runId);
    return fenced;
  }

  static async isBlocked(db: Executor, scope: Pick<ScopeRef, 'uid' | 'runtimeScopeId'>): Promise<boolean> {
    const { rows } = await db.query<{ blocked: boolean }>(
      'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
      [scope.uid, scope.runtimeScopeId],
    );
    return rows[0]!.blocked;
  }
}
