import { type Database, WAIT_FOR_ROW_LOCKS } from './executor.ts';

/**
 * The reclaim guard: ONE statement just before each reclaim DELETE
 * (`runtime_cleanup_begin_reclaim`), the reclaimer's counterpart of the release guard, run by the
 * same delete path (guarded-delete.ts). It takes the advisory lock of every scope whose row names the sandbox (the lock the
 * platform's admission and an operator's forced clear take) and the sandbox id's reclaim lock
 * (the lock a platform recording that id takes, through a trigger), re-reads under them, and
 * either refuses or records the delete in flight, on those rows (so `runtime_cleanup_blocked`
 * refuses admission and force-clear refuses, as for a release) and on the sighting (so the
 * platform cannot record the id meanwhile), and lays down the attempt's tombstone, so that a record of
 * the deleted container stays refused whatever happens after the DELETE. A scope that became active
 * before the guard wins; one that tries after it waits for the DELETE's answer or its deadline.
 */
export const ReclaimVerdict = {
  PROCEED: 'proceed',
  NOT_SIGHTED: 'not_sighted',
  OWNER_CHANGED: 'owner_changed',
  SCOPE_ACTIVE: 'scope_active',
  SCOPE_FENCED: 'scope_fenced',
  DELETE_IN_FLIGHT: 'delete_in_flight',
  SCOPE_RECENT: 'scope_recent',
} as const;
export type ReclaimVerdict = (typeof ReclaimVerdict)[keyof typeof ReclaimVerdict];

const KNOWN = new Set<string>(Object.values(ReclaimVerdict));

const BEGIN_RECLAIM = `
  SELECT verdict, uid, runtime_scope_id, in_flight_until, grace_seconds, hold_seconds
  FROM runtime_cleanup_begin_reclaim($1::text, $2::bigint, $3::boolean, $4::float8, $5::float8, $6::text, $7::int)`;

/**
 * The end of one attempt (`runtime_cleanup_end_reclaim`, migration 011): confirmed, the DELETE may
 * still act, answered without deleting, or never sent. One statement, so a crash in between
 * leaves no half-ended record; and since the guard already laid the attempt's tombstone, a failure
 * of this statement only leaves every record to its own deadline.
 */
const END_RECLAIM = `
  SELECT rows_ended, sighting, tombstone
  FROM runtime_cleanup_end_reclaim($1::text, $2::text, $3::bigint, $4::text, $5::float8)`;

export interface ReclaimTarget {
  sandboxId: string;
  /** The generation the DELETE names. */
  generation: number;
  /** The listing gave that generation (not the database, not a guess). */
  generationListed: boolean;
}

export type ReclaimGuardResult =
  | {
      verdict: typeof ReclaimVerdict.PROCEED;
      token: string;
      until: Date;
      /** The grace and the hold the guard applied: the caller's, or the deployment's if larger. */
      graceSeconds: number;
      holdSeconds: number;
    }
  | {
      verdict: Exclude<ReclaimVerdict, typeof ReclaimVerdict.PROCEED>;
      /** The scope that holds the sandbox, for the scope_* and delete_in_flight verdicts. */
      uid: string | null;
      runtimeScopeId: string | null;
    };

/**
 * The guard, as ONE statement in a one-round-trip READ COMMITTED transaction (`Database.transact`),
 * like the release guard: sent as a plain autocommit statement it ran at whatever isolation the
 * database, the role or a pooled session defaulted to, and under REPEATABLE READ its snapshot was
 * taken before its locks were granted, so it missed a run the platform admitted while it waited.
 */
export async function beginReclaim(
  db: Pick<Database, 'transact'>,
  target: ReclaimTarget,
  options: { graceSeconds: number; inFlightSeconds: number; lockTimeoutMs: number; token: string },
): Promise<ReclaimGuardResult> {
  const { rows } = await db.transact<{
    verdict: string;
    uid: string | null;
    runtime_scope_id: string | null;
    in_flight_until: Date | null;
    grace_seconds: number;
    hold_seconds: number;
  }>(BEGIN_RECLAIM, [
    target.sandboxId,
    target.generation,
    target.generationListed,
    options.graceSeconds,
    options.inFlightSeconds,
    options.token,
    Math.max(1, Math.trunc(options.lockTimeoutMs)),
  ]);
  const row = rows[0]!;
  if (!KNOWN.has(row.verdict)) {
    throw new Error(`runtime_cleanup_begin_reclaim returned an unknown verdict ${row.verdict}`);
  }
  if (row.verdict === ReclaimVerdict.PROCEED) {
    return {
      verdict: ReclaimVerdict.PROCEED,
      token: options.token,
      until: row.in_flight_until!,
      graceSeconds: Number(row.grace_seconds),
      holdSeconds: Number(row.hold_seconds),
    };
  }
  return {
    verdict: row.verdict as Exclude<ReclaimVerdict, typeof ReclaimVerdict.PROCEED>,
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
  };
}

/** How a reclaim attempt ended, as its records need to know it. */
export const ReclaimEnding = {
  CONFIRMED: 'confirmed',
  MAY_STILL_ACT: 'may_still_act',
  ANSWERED: 'answered',
  NOT_SENT: 'not_sent',
} as const;
export type ReclaimEnding = (typeof ReclaimEnding)[keyof typeof ReclaimEnding];

/**
 * Ends the attempt's records (see END_RECLAIM). Safe to repeat (a lost answer): every part of it is
 * matched by the attempt's token and finds nothing left the second time. In a READ COMMITTED
 * transaction of its own (`Database.transact`), as the guard is: its updates wait on rows the
 * platform may be writing, and under a database's or role's REPEATABLE READ default that wait
 * ended in SQLSTATE 40001 and the records were left to their deadlines.
 */
export async function endReclaim(
  db: Pick<Database, 'transact'>,
  target: Pick<ReclaimTarget, 'sandboxId' | 'generation'>,
  token: string,
  ending: ReclaimEnding,
  residualSeconds?: number,
): Promise<void> {
  if (ending === ReclaimEnding.MAY_STILL_ACT && residualSeconds === undefined) {
    throw new Error('endReclaim: an attempt that may still act needs its residual window');
  }
  await db.transact(
    END_RECLAIM,
    [token, target.sandboxId, target.generation, ending, residualSeconds ?? null],
    WAIT_FOR_ROW_LOCKS,
  );
}
