import { randomUUID } from 'node:crypto';
import { ErrorCode, type ReleaseRefusalCode, ReleaseRefusedError, RunNotFoundError } from './errors.ts';
import { type Database, WAIT_FOR_ROW_LOCKS } from './executor.ts';

/**
 * The release guard: just before phase 2 deletes, ONE statement in a one-round-trip READ
 * COMMITTED transaction (`Database.transact`: BEGIN, the call and COMMIT in one message) that
 * takes the scope's advisory lock, checks everything the delete relies on, and, if the delete
 * may go ahead, records on the scope's `sandbox_runtimes` row that a delete is in flight until a
 * deadline. The statement is `runtime_cleanup_begin_release` (infra/sql/, refusing any
 * isolation level but READ COMMITTED since 008); the lock it takes ends with it, so no lock is held while the provisioner works.
 *
 * Why not a plain read: a read cannot serialise with the platform's admission. Between the read
 * and the DELETE an operator's forced clear could drop the fence and the platform admit a new run
 * that reuses the live sandbox (the platform's provisioner hands out the live container again, and
 * its DELETE ignores the generation): the late DELETE then removed a running run's sandbox. Under
 * the scope's advisory lock, admission and force-clear either happen before the guard (it then
 * sees the active run or the missing fence and sends nothing) or after it (they then see the
 * in-flight record: `runtime_cleanup_blocked` is true and force-clear refuses until the record
 * ends).
 *
 * The record ends when the release lowers it (`endRelease`) or at its deadline, whichever comes
 * first, so a release that crashed mid-delete quarantines its scope for a bounded time only.
 */
export const ReleaseGuard = {
  PROCEED: 'proceed',
  /** The fence was cleared (or raised anew) since phase 1: this release is stale, skip it. */
  FENCE_GONE: 'fence_gone',
  /** A run is active in the scope again: deleting now would pull the sandbox from under it. */
  SCOPE_ACTIVE: 'scope_active',
  /** That generation is already confirmed gone (another fence of the scope cleaned it). */
  ALREADY_RELEASED: 'already_released',
} as const;
export type ReleaseGuard = (typeof ReleaseGuard)[keyof typeof ReleaseGuard];

/** The guard's verdicts that mean "this command is not the cleanup the database knows". */
const REFUSALS: Record<string, { code: ReleaseRefusalCode; why: string }> = {
  scope_mismatch: {
    code: ErrorCode.RELEASE_SCOPE_MISMATCH,
    why: "the command's uid or runtime scope is not the run's",
  },
  run_not_root: {
    code: ErrorCode.RELEASE_RUN_NOT_ROOT,
    why: 'the run is a subagent run; it owns no cleanup',
  },
  run_not_terminal: { code: ErrorCode.RELEASE_RUN_NOT_TERMINAL, why: 'the run is not in a terminal status' },
  sandbox_mismatch: {
    code: ErrorCode.RELEASE_SANDBOX_MISMATCH,
    why: "the scope's recorded sandbox is not the command's sandbox id and generation",
  },
};

const BEGIN_RELEASE = `
  SELECT verdict, blocking_run_id, in_flight_until, floor_until::text AS floor_until
  FROM runtime_cleanup_begin_release($1::text, $2::text, $3::text, $4::text, $5::bigint, $6::text,
                                     $7::float8, $8::text, $9::int)`;

/**
 * Lowers this release's own in-flight record (matched by its token; a later attempt that took the
 * record over keeps it), by the rule both deleters share (`runtime_cleanup_end_delete_in_flight`):
 * `$3` NULL, the provisioner answered, so the record falls back to the floor it found (an earlier
 * attempt's deadline still running) or ends; `$3` set, the attempt ended without an answer, so the
 * record is cut to "now + $3 seconds" (the provisioner's own delete time and the margin), never
 * below the floor.
 */
const END_RELEASE = `
  SELECT until FROM runtime_cleanup_end_delete_in_flight($1::text, $2::timestamptz, $3::float8)`;

/** What a release command asks to delete, and the fence it was issued for (phase 1's capture). */
export interface ReleaseTarget {
  runId: string;
  uid: string;
  runtimeScopeId: string;
  sandboxId: string;
  generation: number;
  /** `runtime_cleanup_pending_since` as phase 1 read it (text); null when it was NULL. */
  fenceSetAt: string | null;
}

/** The in-flight record the guard wrote for one release attempt. */
export interface DeleteInFlight {
  uid: string;
  runtimeScopeId: string;
  token: string;
  /** No run is admitted to the scope before this (database clock). */
  until: Date;
  /** An earlier attempt's deadline that was still running (PostgreSQL text), kept as a floor. */
  floorUntil: string | null;
}

export type ReleaseGuardResult =
  | { verdict: typeof ReleaseGuard.PROCEED; inFlight: DeleteInFlight }
  | { verdict: typeof ReleaseGuard.FENCE_GONE }
  | { verdict: typeof ReleaseGuard.ALREADY_RELEASED }
  | { verdict: typeof ReleaseGuard.SCOPE_ACTIVE; activeRunId: string };

export interface BeginReleaseOptions {
  /** From now, how long the delete may still act (`deleteInFlightSeconds`, guarded-delete.ts). */
  inFlightSeconds: number;
  /** How long to wait for the scope's advisory lock before giving up (retryable). */
  lockTimeoutMs: number;
  /** Names this attempt's record; a fresh one per attempt unless given. */
  token?: string;
}

/**
 * The guard. Returns PROCEED with the in-flight record written, or a stale verdict (nothing
 * written). Throws RunNotFoundError, ReleaseRefusedError (forged or mismatched: never retried) and
 * database errors (retryable; DatabaseLockTimeoutError when the scope's lock is busy).
 */
export async function beginRelease(
  db: Pick<Database, 'transact'>,
  target: ReleaseTarget,
  options: BeginReleaseOptions,
): Promise<ReleaseGuardResult> {
  const token = options.token ?? randomUUID();
  const { rows } = await db.transact<{
    verdict: string;
    blocking_run_id: string | null;
    in_flight_until: Date | null;
    floor_until: string | null;
  }>(BEGIN_RELEASE, [
    target.runId,
    target.uid,
    target.runtimeScopeId,
    target.sandboxId,
    target.generation,
    target.fenceSetAt,
    options.inFlightSeconds,
    token,
    Math.max(1, Math.trunc(options.lockTimeoutMs)),
  ]);
  const row = rows[0]!;
  switch (row.verdict) {
    case ReleaseGuard.PROCEED:
      return {
        verdict: ReleaseGuard.PROCEED,
        inFlight: {
          uid: target.uid,
          runtimeScopeId: target.runtimeScopeId,
          token,
          until: row.in_flight_until!,
          floorUntil: row.floor_until,
        },
      };
    case ReleaseGuard.FENCE_GONE:
      return { verdict: ReleaseGuard.FENCE_GONE };
    case ReleaseGuard.ALREADY_RELEASED:
      return { verdict: ReleaseGuard.ALREADY_RELEASED };
    case ReleaseGuard.SCOPE_ACTIVE:
      return { verdict: ReleaseGuard.SCOPE_ACTIVE, activeRunId: row.blocking_run_id! };
    case 'run_not_found':
      // A run that does not exist is not a fence that went away: the contract parks such a message
      // in the DLQ with its reason (found by the chaos suite: hostile releases were acknowledged).
      throw new RunNotFoundError(target.runId);
  }
  const refusal = REFUSALS[row.verdict];
  if (!refusal) throw new Error(`runtime_cleanup_begin_release returned an unknown verdict ${row.verdict}`);
  throw new ReleaseRefusedError(refusal.code, `release refused before any DELETE: ${refusal.why}`, {
    runId: target.runId,
    uid: target.uid,
    runtimeScopeId: target.runtimeScopeId,
    sandboxId: target.sandboxId,
    generation: target.generation,
  });
}

/**
 * Lowers the attempt's in-flight record once its delete is over. `residualSeconds` undefined: the
 * provisioner answered (or the request was never sent), so nothing of this attempt can act any
 * more. Set: the attempt ended without an answer, and the provisioner may still carry out the
 * request for that long. Returns the record's new deadline (null: ended), or undefined when the
 * record was no longer this attempt's (a later attempt took it over; its deadline covers ours).
 *
 * In a READ COMMITTED transaction of its own (`Database.transact`), not as an autocommit
 * statement: its UPDATE waits on the scope's row when the platform or another attempt holds it,
 * and at a database or role default of REPEATABLE READ or SERIALIZABLE that wait ended in
 * SQLSTATE 40001 (the row changed after the statement's snapshot) instead of the update. Safe to
 * repeat after a lost answer: matched by the token, a second run finds the record already lowered.
 */
export async function endRelease(
  db: Pick<Database, 'transact'>,
  inFlight: DeleteInFlight,
  residualSeconds?: number,
): Promise<Date | null | undefined> {
  const { rows } = await db.transact<{ until: Date | null }>(
    END_RELEASE,
    [inFlight.token, inFlight.floorUntil, residualSeconds ?? null],
    WAIT_FOR_ROW_LOCKS,
  );
  return rows.length ? rows[0]!.until : undefined;
}
