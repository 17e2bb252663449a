/**
 * Database faults. Both act only on this database and, for terminations, only on the stack's own
 * connections (its `application_name`), never on the chaos suite's instrumentation or on another
 * engineer's database in the same cluster.
 */
import type { Database } from '../../functions/adapters/database.ts';
import { preciseNow } from './clock.ts';
import { FaultKind } from './plan.ts';
import type { Rng } from './random.ts';

/** What a stack backend was doing when it was terminated, read from its last statement. */
export const BackendPhase = {
  FENCE_CHECK_LOCK: 'fence_check.lock_scope_of_run',
  FINALIZE_LOCK: 'finalize.lock_scope',
  INSPECT: 'fence_check_or_finalize.inspect_run',
  FINALIZE_CLEAR: 'finalize.clear_fence',
  TRANSACTION_BOUNDARY: 'transaction_begin_or_commit',
  SWEEPER: 'sweeper',
  IDLE_BETWEEN_PHASES: 'idle_connection_between_phases',
  OTHER: 'other',
} as const;
export type BackendPhase = (typeof BackendPhase)[keyof typeof BackendPhase];

/**
 * How much of a backend's statement text phaseOf reads: a one-message transaction shows as its
 * whole message, whose BEGIN and SET LOCALs alone take some 350 characters before the statement
 * that names the phase. PostgreSQL keeps at most track_activity_query_size (1024 bytes by default).
 */
export const PHASE_TEXT_CHARS = 1000;

const STACK_BACKENDS = `
  SELECT pid, state, left(query, ${PHASE_TEXT_CHARS}) AS query FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = $1::text AND pid <> pg_backend_pid()
    AND backend_type = 'client backend'`;
const TERMINATE = 'SELECT pg_terminate_backend($1::int) AS terminated';

export function phaseOf(state: string | null, query: string): BackendPhase {
  if (state === 'idle') return BackendPhase.IDLE_BETWEEN_PHASES;
  if (/FROM agent_runs r\s+WHERE r\.id/.test(query)) return BackendPhase.FENCE_CHECK_LOCK;
  if (/WITH cleared AS/.test(query)) return BackendPhase.FINALIZE_CLEAR;
  if (/WITH RECURSIVE run AS/.test(query)) return BackendPhase.INSPECT;
  if (/pg_advisory_xact_lock\(runtime_cleanup_lock_key\(\$1::text/.test(query))
    return BackendPhase.FINALIZE_LOCK;
  // Before the BEGIN test: the sweeper's claim and unclaim are one-message transactions
  // (Database.transact), so their text starts with BEGIN too.
  if (/WITH due AS|FENCE_STATS|runtime_cleanup_announced_at/.test(query)) return BackendPhase.SWEEPER;
  if (/^\s*(BEGIN|COMMIT|ROLLBACK)/i.test(query)) return BackendPhase.TRANSACTION_BOUNDARY;
  return BackendPhase.OTHER;
}

/**
 * Terminates stack backends at a mean rate (`meanIntervalMs`), looking at them every `pollMs`.
 * Most cleanup transactions last a few milliseconds, so waiting for a random moment would nearly
 * always hit an idle pooled connection: instead, when a kill is due, a backend caught inside a
 * phase (a lock, the inspection, the clear, a commit, the sweeper) is preferred, and an idle one
 * (the connection dropped between phases) is taken otherwise or one time in five.
 */
export class BackendTerminator {
  readonly killsByPhase = new Map<BackendPhase, number>();
  /** When each termination fell (preciseNow): a run it hit was impeded by the suite, not by itself. */
  readonly killedAtMs: number[] = [];
  /** Resolves at the first termination (the coverage run waits for it instead of hoping). */
  readonly firstKill: Promise<void>;
  #resolveFirstKill!: () => void;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> = Promise.resolve();
  #tokens = 0;
  #lastRefill = performance.now();

  constructor(
    private readonly admin: Database,
    private readonly stackApplicationName: string,
    private readonly rng: Rng,
    private readonly rate: { meanIntervalMs: number; pollMs: number },
    private readonly onKill: (kind: FaultKind) => void,
    /**
     * True while no kill may fall: the terminations come "while runs execute", and a quiet window
     * (reclaimer.quiet_fleet) has none. Left on, its one busy backend, the reclaimer's, drew every
     * kill: nine reclaimer runs in a row failed, and invariant Q measured the terminator.
     */
    private readonly paused: () => boolean = () => false,
  ) {
    this.firstKill = new Promise((resolve) => {
      this.#resolveFirstKill = resolve;
    });
  }

  start(): void {
    const tick = () => {
      this.#timer = setTimeout(() => {
        this.#running = this.#poll()
          .catch(() => {})
          .finally(() => {
            if (this.#timer) tick();
          });
      }, this.rate.pollMs);
    };
    tick();
  }

  async stop(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#running;
  }

  async #poll(): Promise<void> {
    const now = performance.now();
    // A pause banks no kills for the moment it ends.
    const earned = this.paused() ? 0 : (now - this.#lastRefill) / this.rate.meanIntervalMs;
    this.#tokens = Math.min(3, this.#tokens + earned);
    this.#lastRefill = now;
    if (this.#tokens < 1 || this.paused()) return;
    const { rows } = await this.admin.query<{ pid: number; state: string | null; query: string }>(
      STACK_BACKENDS,
      [this.stackApplicationName],
    );
    const byPhase = new Map<BackendPhase, number[]>();
    for (const row of rows) {
      const phase = phaseOf(row.state, row.query);
      byPhase.set(phase, [...(byPhase.get(phase) ?? []), row.pid]);
    }
    const busy = [...byPhase.keys()].filter((phase) => phase !== BackendPhase.IDLE_BETWEEN_PHASES);
    const idle = byPhase.has(BackendPhase.IDLE_BETWEEN_PHASES);
    let phase: BackendPhase | undefined;
    if (busy.length > 0 && (!idle || this.rng.chance(0.8))) phase = this.rng.pick(busy);
    else if (idle && (this.#tokens >= 2 || this.rng.chance(0.05))) phase = BackendPhase.IDLE_BETWEEN_PHASES;
    if (phase === undefined) return;
    const pid = this.rng.pick(byPhase.get(phase)!);
    // The pause may have begun while the backends were read.
    if (this.paused()) return;
    this.#tokens -= 1;
    const result = await this.admin.query<{ terminated: boolean }>(TERMINATE, [pid]);
    if (!result.rows[0]?.terminated) return;
    this.killedAtMs.push(preciseNow());
    this.killsByPhase.set(phase, (this.killsByPhase.get(phase) ?? 0) + 1);
    this.onKill(FaultKind.DB_BACKEND_TERMINATED);
    this.#resolveFirstKill();
  }
}

const LOCK_SCOPE = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';
const LOCK_RUN_ROW = 'SELECT id FROM agent_runs WHERE id = $1::text FOR UPDATE';

/**
 * Holds a scope's advisory lock, or a run's row lock, from a connection of its own for a while, as
 * another platform transaction would: the cleanup's transactions wait up to their lock timeout
 * and then fail (retryably) when the hold is longer.
 */
export async function holdLock(
  locker: Database,
  target: { kind: 'advisory'; uid: string; runtimeScopeId: string } | { kind: 'row'; runId: string },
  holdMs: number,
): Promise<boolean> {
  try {
    await locker.withTransaction(async (tx) => {
      if (target.kind === 'advisory') await tx.query(LOCK_SCOPE, [target.uid, target.runtimeScopeId]);
      else await tx.query(LOCK_RUN_ROW, [target.runId]);
      await new Promise((resolve) => setTimeout(resolve, holdMs));
    });
    return true;
  } catch {
    // The lock was not had within the locker's own lock timeout (a cleanup held it): no fault.
    return false;
  }
}
