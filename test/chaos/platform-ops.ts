/**
 * What the chaos suite's platform does beyond the PlatformSimulator: a pool of scopes to reuse
 * (admission gating and generation bumps need a scope to see several runs), the map from sandbox
 * id to scope that the probe and the checks need, and the platform-side faults that change a
 * cleanup's identity under it (a Workdir moved, the sandbox re-created or replaced).
 */
import { randomUUID } from 'node:crypto';
import type { Database } from '../../functions/adapters/database.ts';
import type { PlatformSimulator, ScopeRef } from '../../infra/local/platform.ts';
import type { ScopeKey } from './lock-probe.ts';

export interface ScopeState {
  ref: ScopeRef;
  /** Every sandbox id this scope has used. */
  sandboxIds: Set<string>;
  runs: number;
  /** A scope whose sandbox a lying provisioner answer left behind admits no further runs. */
  retired: boolean;
  replacements: number;
}

export class ScopePool {
  readonly #idle: ScopeState[] = [];
  readonly all: ScopeState[] = [];
  readonly #bySandbox = new Map<string, ScopeState>();

  constructor(private readonly platform: PlatformSimulator) {}

  async take(reuse: boolean, pickIndex: (length: number) => number): Promise<ScopeState> {
    if (reuse && this.#idle.length > 0) {
      const [scope] = this.#idle.splice(pickIndex(this.#idle.length), 1);
      return scope!;
    }
    const scope: ScopeState = {
      ref: await this.platform.createScope(),
      sandboxIds: new Set(),
      runs: 0,
      retired: false,
      replacements: 0,
    };
    this.all.push(scope);
    return scope;
  }

  give(scope: ScopeState): void {
    if (!scope.retired) this.#idle.push(scope);
  }

  noteSandbox(scope: ScopeState, sandboxId: string): void {
    scope.sandboxIds.add(sandboxId);
    this.#bySandbox.set(sandboxId, scope);
  }

  scopeOfSandbox(sandboxId: string): ScopeKey | undefined {
    const scope = this.#bySandbox.get(sandboxId);
    return scope && { uid: scope.ref.uid, runtimeScopeId: scope.ref.runtimeScopeId };
  }

  sandboxScopes(): Map<string, string> {
    return new Map([...this.#bySandbox].map(([id, scope]) => [id, scopeKeyText(scope.ref)]));
  }
}

export function scopeKeyText(scope: Pick<ScopeKey, 'uid' | 'runtimeScopeId'>): string {
  return `${scope.uid}\u0000${scope.runtimeScopeId}`;
}

const CHANGE_WORKDIR = 'UPDATE conversations SET workdir_path = $2::text WHERE id = $1::bigint';

/** The user moved the conversation's files: phase 3 must notice and restart at phase 1. */
export async function changeWorkdir(db: Database, scope: ScopeRef): Promise<void> {
  await db.query(CHANGE_WORKDIR, [scope.conversationId, `projects/${randomUUID()}`]);
}

const LOCK_SCOPE = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';
/**
 * "A fence is up", read directly: runtime_cleanup_blocked is also true while a release's DELETE may
 * still be in flight after the fence cleared, and re-provisioning then would leave a sandbox no
 * fence covers.
 */
const SCOPE_STATE = `
  SELECT EXISTS (SELECT 1 FROM agent_runs WHERE uid = $1::text AND runtime_scope_id = $2::text
                   AND runtime_cleanup_pending AND run_type <> 'subagent') AS blocked,
         (SELECT sandbox_id FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text) AS sandbox_id`;
const RECORD_SANDBOX = `
  INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
  VALUES ($1::text, $2::text, $3::text, $4::bigint)
  ON CONFLICT (uid, runtime_scope_id)
  DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = EXCLUDED.generation, released_at = NULL`;

export type RecreateOutcome = 'recreated' | 'replaced' | 'not_fenced' | 'still_live';

/**
 * The platform re-provisions the sandbox of a scope whose cleanup is in flight, once the old
 * sandbox is gone at the provisioner (a warm-pool refresher, a resumed session): under the same
 * id (the provisioner hands out the next generation) or under a new id (generations restart at 1
 * for it). It holds the scope's advisory lock across the check, the create and the record, as any
 * platform transaction on a scope does, so the new sandbox is either seen by phase 3 or created
 * after the fence is down — and only while a fence is up, so it never leaves an idle scope with a
 * sandbox nobody will clean up.
 */
export async function recreateSandbox(
  db: Database,
  provisionerUrl: string,
  scope: ScopeState,
  newId: boolean,
  onSandbox: (sandboxId: string) => void,
): Promise<RecreateOutcome> {
  const { uid, runtimeScopeId, threadId } = scope.ref;
  return db.withTransaction(async (tx) => {
    await tx.query(LOCK_SCOPE, [uid, runtimeScopeId]);
    const state = (
      await tx.query<{ blocked: boolean; sandbox_id: string | null }>(SCOPE_STATE, [uid, runtimeScopeId])
    ).rows[0]!;
    if (!state.blocked) return 'not_fenced';
    const current = state.sandbox_id ?? `sbx-${runtimeScopeId}`;
    const probe = await fetch(new URL(`/api/sandboxes/${encodeURIComponent(current)}`, provisionerUrl), {
      signal: AbortSignal.timeout(2_000),
    });
    await probe.body?.cancel();
    if (probe.status !== 404) return 'still_live';
    const sandboxId = newId ? `sbx-${runtimeScopeId}-r${scope.replacements + 1}` : current;
    // Known before the create: a DELETE of it may follow at once, and the probe must map it.
    onSandbox(sandboxId);
    const response = await fetch(new URL('/api/sandboxes', provisionerUrl), {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ sandbox_id: sandboxId, thread_id: threadId, user_id: uid }),
      signal: AbortSignal.timeout(5_000),
    });
    if (response.status !== 200 && response.status !== 201) {
      throw new Error(
        `provisioner refused to create ${sandboxId}: ${response.status} ${await response.text()}`,
      );
    }
    const { generation } = (await response.json()) as { generation: number };
    await tx.query(RECORD_SANDBOX, [uid, runtimeScopeId, sandboxId, generation]);
    if (newId) scope.replacements += 1;
    return newId ? 'replaced' : 'recreated';
  });
}

const UNCLEARED = 'SELECT id FROM agent_runs WHERE id = ANY ($1::text[]) AND runtime_cleanup_pending';

/**
 * One poller for every run waiting for its fence to clear (instead of one query loop per run):
 * every `intervalMs` it asks which of the awaited runs are still fenced.
 */
export class FenceWatcher {
  readonly #waiting = new Map<string, Array<() => void>>();
  #timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly db: Database,
    private readonly intervalMs: number,
  ) {}

  start(): void {
    const tick = () => {
      this.#timer = setTimeout(() => {
        void this.#poll().finally(() => {
          if (this.#timer) tick();
        });
      }, this.intervalMs);
    };
    tick();
  }

  stop(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  /** Resolves true once none of `runIds` is fenced, false at the deadline. */
  waitCleared(runIds: readonly string[], timeoutMs: number): Promise<boolean> {
    const each = runIds.map(
      (runId) =>
        new Promise<boolean>((resolve) => {
          const cleared = () => {
            clearTimeout(timer);
            resolve(true);
          };
          const timer = setTimeout(() => {
            // Stop polling for a run nobody waits for any more.
            const rest = (this.#waiting.get(runId) ?? []).filter((waiter) => waiter !== cleared);
            if (rest.length) this.#waiting.set(runId, rest);
            else this.#waiting.delete(runId);
            resolve(false);
          }, timeoutMs);
          this.#waiting.set(runId, [...(this.#waiting.get(runId) ?? []), cleared]);
        }),
    );
    return Promise.all(each).then((results) => results.every(Boolean));
  }

  async #poll(): Promise<void> {
    const ids = [...this.#waiting.keys()];
    if (ids.length === 0) return;
    try {
      const { rows } = await this.db.query<{ id: string }>(UNCLEARED, [ids]);
      const fenced = new Set(rows.map((row) => row.id));
      for (const id of ids) {
        if (fenced.has(id)) continue;
        for (const resolve of this.#waiting.get(id) ?? []) resolve();
        this.#waiting.delete(id);
      }
    } catch {
      // The next tick asks again.
    }
  }
}
