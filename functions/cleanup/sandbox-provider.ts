import { type CleanupError, ReleaseLockTimeoutError } from './errors.ts';
import { KeyedLock } from './keyed-lock.ts';
import type { ReleaseOutcome, ReleaseResult } from './types.ts';

/** One bounded delete of one sandbox generation. */
export interface DeleteSandboxRequest {
  sandboxId: string;
  generation: number;
  /** Bounds this one HTTP exchange, headers and body. */
  deleteTimeoutMs: number;
  /** The caller's deadline (the whole release); aborting it really closes the request. */
  signal?: AbortSignal;
  /**
   * Called when an attempt ended without an answer after its request may have reached the
   * provisioner (a reset) and the client tries again: that first DELETE may still be carried out.
   */
  onUnansweredAttempt?: (error: CleanupError) => void;
}

/**
 * The provisioner's delete as the protocol needs it; `functions/adapters/provisioner-client.ts`
 * implements it over HTTP with the contract's reply semantics.
 */
export interface SandboxDeleteClient {
  deleteSandbox(request: DeleteSandboxRequest): Promise<ReleaseOutcome>;
  close(): Promise<void>;
}

export interface SandboxProviderOptions {
  client: SandboxDeleteClient;
  releaseLockTimeoutMs: number;
  provisionerDeleteTimeoutMs: number;
  lock?: KeyedLock;
}

export interface SandboxRef {
  uid: string;
  runtimeScopeId: string;
  sandboxId: string;
  generation: number;
}

/**
 * The sandbox provider's release: the scope's keyed lock (bounded wait), then the provisioner's
 * delete (bounded). If the lock is not had in time the delete is never sent.
 */
export class SandboxProvider {
  readonly lock: KeyedLock;
  readonly #options: SandboxProviderOptions;

  constructor(options: SandboxProviderOptions) {
    this.#options = options;
    this.lock = options.lock ?? new KeyedLock();
  }

  /** Closes the provisioner client's connections. */
  async close(): Promise<void> {
    await this.#options.client.close();
  }

  static lockKey(ref: Pick<SandboxRef, 'uid' | 'runtimeScopeId'>): string {
    return `${ref.uid}:${ref.runtimeScopeId}`;
  }

  async release(ref: SandboxRef, signal?: AbortSignal): Promise<ReleaseResult> {
    const key = SandboxProvider.lockKey(ref);
    const { releaseLockTimeoutMs, provisionerDeleteTimeoutMs, client } = this.#options;
    const waitStarted = performance.now();
    const unlock = await this.lock.acquire(key, {
      timeoutMs: releaseLockTimeoutMs,
      ...(signal ? { signal } : {}),
      onTimeout: () =>
        new ReleaseLockTimeoutError(
          `release lock for scope ${key} not acquired within ${releaseLockTimeoutMs} ms`,
          {
            uid: ref.uid,
            runtimeScopeId: ref.runtimeScopeId,
            lockTimeoutMs: releaseLockTimeoutMs,
          },
          // The wait ended before anything was sent.
          { deleteMayStillAct: false },
        ),
    });
    const lockWaitMs = performance.now() - waitStarted;
    const deleteStarted = performance.now();
    let unansweredAttempts = 0;
    try {
      const outcome = await client.deleteSandbox({
        sandboxId: ref.sandboxId,
        generation: ref.generation,
        deleteTimeoutMs: provisionerDeleteTimeoutMs,
        ...(signal ? { signal } : {}),
        onUnansweredAttempt: () => {
          unansweredAttempts += 1;
        },
      });
      return { outcome, lockWaitMs, deleteMs: performance.now() - deleteStarted, unansweredAttempts };
    } finally {
      unlock();
    }
  }
}
