import { CleanupTimeoutError } from './errors.ts';
import type { SandboxProvider } from './sandbox-provider.ts';
import { type CleanupIdentity, ReleaseOutcome, type ReleaseResult } from './types.ts';

/**
 * Phase 2 — release, with no database transaction open anywhere in this process for this
 * cleanup: phase 1 committed before this is called and phase 3 begins after it returns.
 *
 * The whole release (lock wait + delete) is bounded by `runtimeCleanupTimeoutMs` through one
 * AbortSignal that really aborts the HTTP request, unlike the original design, whose timed-out
 * thread went on running. A caller's own deadline (the Lambda's remaining time) can shorten it.
 */
export interface ReleaseOptions {
  provider: SandboxProvider;
  runtimeCleanupTimeoutMs: number;
  signal?: AbortSignal;
}

export async function release(identity: CleanupIdentity, options: ReleaseOptions): Promise<ReleaseResult> {
  if (identity.sandboxId === null || identity.generation === null) {
    return { outcome: ReleaseOutcome.ABSENT, lockWaitMs: 0, deleteMs: 0 };
  }
  const { runtimeCleanupTimeoutMs } = options;
  const deadline = new AbortController();
  const timer = setTimeout(
    () =>
      deadline.abort(
        new CleanupTimeoutError(
          `release did not finish within ${runtimeCleanupTimeoutMs} ms`,
          { runId: identity.runId, runtimeCleanupTimeoutMs },
          // As the deadline's reason it ends a wait for the keyed lock, before anything was sent;
          // when it aborts a DELETE on the wire, the provisioner client marks it as may still act.
          { deleteMayStillAct: false },
        ),
      ),
    runtimeCleanupTimeoutMs,
  );
  const signal = options.signal ? AbortSignal.any([options.signal, deadline.signal]) : deadline.signal;
  try {
    return await options.provider.release(
      {
        uid: identity.uid,
        runtimeScopeId: identity.runtimeScopeId,
        sandboxId: identity.sandboxId,
        generation: identity.generation,
      },
      signal,
    );
  } finally {
    clearTimeout(timer);
  }
}
