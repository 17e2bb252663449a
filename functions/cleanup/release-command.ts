import { MAX_RESTARTS, nextRestart, type RetryPolicy } from './chain-limits.ts';
import { ErrorCode, IdentityUnstableError, ReleaseRefusedError } from './errors.ts';
import type { Database } from './executor.ts';
import { deleteBehindGuard } from './guarded-delete.ts';
import {
  beginRelease,
  type DeleteInFlight,
  endRelease,
  ReleaseGuard,
  type ReleaseGuardResult,
  type ReleaseTarget,
} from './release-guard.ts';
import type { SandboxProvider } from './sandbox-provider.ts';
import type { ReleaseOutcome, ReleaseResult } from './types.ts';

/**
 * Phase 2 as one decision: a release command in, what to do next out. The release handler only
 * wires it (parse the command, call this, publish what it says); every protocol rule of the phase
 * is here or below it:
 *
 *   release guard (one statement under the scope's lock) → DELETE (no transaction, bounded) →
 *   settle the delete-in-flight record (guarded-delete.ts, shared with the reclaimer)
 *
 * and the guard's verdicts become: finalize (confirmed), skip (the fence it was for is gone),
 * restart at phase 1 (the scope is busy again, the generation is already released, or the scope's
 * sandbox is another one — counted and bounded by chain-limits.ts), or a failure (retried with
 * backoff, or dead-lettered when it never can succeed).
 */
export interface ReleaseCommandInput extends ReleaseTarget {
  /** The chain's restarts so far. */
  restarts?: number | undefined;
}

export interface ReleaseCommandOptions {
  db: Pick<Database, 'transact' | 'query'>;
  provider: SandboxProvider;
  /** The whole release's bound (lock wait + delete), already cut to the caller's own deadline. */
  boundMs: number;
  provisionerDeleteTimeoutSeconds: number;
  /** How long the guard waits for the scope's advisory lock. */
  databaseLockTimeoutMs: number;
  retryPolicy: RetryPolicy;
  now?: () => number;
}

/** Facts about the attempt's delete-in-flight record, for the caller's log. */
export interface QuarantineFacts {
  /** Set when the scope stays closed after the attempt because its DELETE may still act. */
  quarantinedUntil?: Date;
  /** Set when the record could not be lowered: it then ends at its own deadline. */
  settleError?: unknown;
  recordUntil?: Date;
}

export type ReleaseDecision =
  | ({ action: 'finalize'; outcome: ReleaseOutcome; result: ReleaseResult } & QuarantineFacts)
  | { action: 'skip'; verdict: typeof ReleaseGuard.FENCE_GONE }
  | {
      action: 'restart';
      verdict: typeof ReleaseGuard.SCOPE_ACTIVE | typeof ReleaseGuard.ALREADY_RELEASED;
      restarts: number;
      delaySeconds: number;
      activeRunId?: string;
    }
  /** Refused before any DELETE: dead-letter `error`; restart at phase 1 first when `restart` is set. */
  | { action: 'refused'; error: ReleaseRefusedError; restart?: { restarts: number; delaySeconds: number } }
  /** The DELETE failed (or was never sent): `error` decides retry or dead letter. */
  | ({ action: 'failed'; error: unknown } & QuarantineFacts);

export async function processReleaseCommand(
  command: ReleaseCommandInput,
  options: ReleaseCommandOptions,
): Promise<ReleaseDecision> {
  const { db } = options;
  const facts: QuarantineFacts = {};
  let attempt: Awaited<
    ReturnType<typeof deleteBehindGuard<DeleteInFlight, Exclude<ReleaseGuardResult, { verdict: 'proceed' }>>>
  >;
  try {
    attempt = await deleteBehindGuard({
      target: command,
      provider: options.provider,
      boundMs: options.boundMs,
      provisionerDeleteTimeoutSeconds: options.provisionerDeleteTimeoutSeconds,
      guardWaitMs: options.databaseLockTimeoutMs,
      ...(options.now ? { now: options.now } : {}),
      async guard(holdSeconds) {
        const guard = await beginRelease(db, command, {
          inFlightSeconds: holdSeconds,
          lockTimeoutMs: options.databaseLockTimeoutMs,
        });
        return guard.verdict === ReleaseGuard.PROCEED
          ? { proceed: true, record: guard.inFlight }
          : { proceed: false, refusal: guard };
      },
      async settle(record, ending) {
        facts.recordUntil = record.until;
        const until = await endRelease(
          db,
          record,
          ending.kind === 'not_sent' ? undefined : ending.residualSeconds,
        );
        if (until) facts.quarantinedUntil = until;
      },
    });
  } catch (error) {
    // The guard refused a forged or mismatched command before any DELETE.
    if (error instanceof ReleaseRefusedError) return refusedBeforeDelete(command, error, options.retryPolicy);
    throw error;
  }

  if (attempt.kind === 'refused') {
    const guard = attempt.refusal;
    if (guard.verdict === ReleaseGuard.FENCE_GONE) return { action: 'skip', verdict: guard.verdict };
    // Restart at phase 1: it defers while the scope is busy, and finds nothing to delete once the
    // generation is gone. Counted and delayed like every restart, dead-lettered past the bound.
    const next = nextRestart(command.restarts, options.retryPolicy);
    if (!next) {
      throw new IdentityUnstableError(
        `the release guard answered ${guard.verdict} after ${MAX_RESTARTS} restarts at phase 1; fence kept, left to the sweeper`,
        { verdict: guard.verdict, restarts: command.restarts ?? 0 },
      );
    }
    return {
      action: 'restart',
      verdict: guard.verdict as typeof ReleaseGuard.SCOPE_ACTIVE | typeof ReleaseGuard.ALREADY_RELEASED,
      ...next,
      ...(guard.verdict === ReleaseGuard.SCOPE_ACTIVE ? { activeRunId: guard.activeRunId } : {}),
    };
  }
  if (attempt.settleError !== undefined) facts.settleError = attempt.settleError;
  if (attempt.kind === 'answered') {
    return { action: 'finalize', outcome: attempt.result.outcome, result: attempt.result, ...facts };
  }
  return { action: 'failed', error: attempt.error, ...facts };
}

/**
 * The command is parked; the fence it names is not. A sandbox mismatch restarts phase 1, which
 * resolves the run's cleanup again from the database (a platform that recorded a new sandbox while
 * the fence was up gets it cleaned without waiting for the sweeper), within the restart bound.
 */
function refusedBeforeDelete(
  command: ReleaseCommandInput,
  error: ReleaseRefusedError,
  policy: RetryPolicy,
): ReleaseDecision {
  if (error.code !== ErrorCode.RELEASE_SANDBOX_MISMATCH) return { action: 'refused', error };
  const next = nextRestart(command.restarts, policy);
  return next ? { action: 'refused', error, restart: next } : { action: 'refused', error };
}
