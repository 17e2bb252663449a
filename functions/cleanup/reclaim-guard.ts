import type { Executor } from './executor.ts';

/**
 * The reclaim guard: ONE autocommit statement just before each reclaim DELETE
 * (`runtime_cleanup_begin_reclaim`, migration 009), the reclaimer's counterpart of the release
 * guard. It takes the advisory lock of every scope whose row names the sandbox (the lock the
 * platform's admission and an operator's forced clear take) and the sandbox id's reclaim lock
 * (the lock a platform recording that id takes, through a trigger), re-reads under them, and
 * either refuses or records the delete in flight, on those rows (so `runtime_cleanup_blocked`
 * refuses admission and force-clear refuses, as for a release) and on the sighting (so the
 * platform cannot record the id meanwhile). A scope that became active before the guard wins; one
 * that tries after it waits for the DELETE's answer or its deadline.
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
  SELECT verdict, uid, runtime_scope_id, in_flight_until
  FROM runtime_cleanup_begin_reclaim($1::text, $2::bigint, $3::float8, $4::float8, $5::text, $6::int)`;

/**
 * Once the provisioner answered (or the request was never sent), this attempt's records end: the
 * rows it marked drop their delete-in-flight record (only if still this attempt's), and the
 * sighting either goes (`confirmed`: the sandbox is gone, the generation deleted is marked
 * released on every row that names it unreleased, and a tombstone refuses the platform recording
 * that id, at most that generation, for the grace: see 009) or stays for the next run with its
 * record cleared. Expired tombstones go here too, so the table holds at most the grace's reclaims.
 * One statement, so a crash in between leaves no half-ended record.
 */
const END_RECLAIM = `
  WITH rows_ended AS (
    UPDATE sandbox_runtimes s
    SET delete_in_flight_until = NULL, delete_in_flight_token = NULL, delete_in_flight_run_id = NULL,
        delete_in_flight_sandbox_id = NULL, delete_in_flight_generation = NULL,
        released_at = CASE
          WHEN $3::boolean AND s.sandbox_id = $2::text AND s.generation = $4::bigint AND s.released_at IS NULL
            THEN now() ELSE s.released_at END
    WHERE s.delete_in_flight_token = $1::text
    RETURNING 1
  ), sighting_ended AS (
    UPDATE runtime_reclaim_sightings g
    SET reclaim_in_flight_until = NULL, reclaim_in_flight_token = NULL
    WHERE g.sandbox_id = $2::text AND g.reclaim_in_flight_token = $1::text AND NOT $3::boolean
    RETURNING 1
  ), sighting_gone AS (
    DELETE FROM runtime_reclaim_sightings g
    WHERE g.sandbox_id = $2::text AND g.reclaim_in_flight_token = $1::text AND $3::boolean
    RETURNING 1
  ), tombstones_expired AS (
    DELETE FROM runtime_reclaim_tombstones t WHERE t.expires_at <= clock_timestamp()
    RETURNING 1
  ), tombstone AS (
    INSERT INTO runtime_reclaim_tombstones (sandbox_id, reclaimed_generation, reclaimed_at, expires_at)
    SELECT $2::text, $5::bigint, now(), clock_timestamp() + make_interval(secs => $6::float8)
    FROM sighting_gone
    ON CONFLICT (sandbox_id) DO UPDATE
      SET reclaimed_generation = CASE
            WHEN runtime_reclaim_tombstones.reclaimed_generation IS NULL OR EXCLUDED.reclaimed_generation IS NULL
              THEN NULL
            ELSE greatest(runtime_reclaim_tombstones.reclaimed_generation, EXCLUDED.reclaimed_generation) END,
          reclaimed_at = EXCLUDED.reclaimed_at,
          expires_at = greatest(runtime_reclaim_tombstones.expires_at, EXCLUDED.expires_at)
    RETURNING 1
  )
  SELECT (SELECT count(*) FROM rows_ended)::int AS rows_ended,
         (SELECT count(*) FROM tombstones_expired)::int AS tombstones_expired,
         (SELECT count(*) FROM tombstone)::int AS tombstones_left,
         (SELECT count(*) FROM sighting_ended)::int + (SELECT count(*) FROM sighting_gone)::int AS sightings_ended`;

export interface ReclaimTarget {
  sandboxId: string;
  /** The generation the DELETE names. */
  generation: number;
}

export type ReclaimGuardResult =
  | { verdict: typeof ReclaimVerdict.PROCEED; token: string; until: Date }
  | {
      verdict: Exclude<ReclaimVerdict, typeof ReclaimVerdict.PROCEED>;
      /** The scope that holds the sandbox, for the scope_* and delete_in_flight verdicts. */
      uid: string | null;
      runtimeScopeId: string | null;
    };

export async function beginReclaim(
  db: Executor,
  target: ReclaimTarget,
  options: { graceSeconds: number; inFlightSeconds: number; lockTimeoutMs: number; token: string },
): Promise<ReclaimGuardResult> {
  const { rows } = await db.query<{
    verdict: string;
    uid: string | null;
    runtime_scope_id: string | null;
    in_flight_until: Date | null;
  }>(BEGIN_RECLAIM, [
    target.sandboxId,
    target.generation,
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
    return { verdict: ReclaimVerdict.PROCEED, token: options.token, until: row.in_flight_until! };
  }
  return {
    verdict: row.verdict as Exclude<ReclaimVerdict, typeof ReclaimVerdict.PROCEED>,
    uid: row.uid,
    runtimeScopeId: row.runtime_scope_id,
  };
}

/**
 * Ends this attempt's records after the provisioner answered. `confirmed`: the sandbox is gone
 * (deleted, absent, or that generation superseded). Not called for an attempt that ended without
 * an answer: its records keep the scope and the id quarantined until their deadline, since the
 * provisioner may still carry the DELETE out.
 */
export async function endReclaim(
  db: Executor,
  target: ReclaimTarget,
  token: string,
  confirmed: boolean,
  tombstone?: TombstoneOptions,
): Promise<void> {
  if (confirmed && !tombstone) throw new Error('endReclaim: a confirmed reclaim needs its tombstone');
  await db.query(END_RECLAIM, [
    token,
    target.sandboxId,
    confirmed,
    target.generation,
    tombstone?.generationKnown === false ? null : target.generation,
    Math.max(0, tombstone?.seconds ?? 0),
  ]);
}

/** The tombstone a confirmed reclaim leaves (runtime_reclaim_tombstones, migration 009). */
export interface TombstoneOptions {
  /** False when the generation deleted was a guess: the tombstone then refuses every generation. */
  generationKnown: boolean;
  /** How long the platform's records of the id stay refused (the grace). */
  seconds: number;
}
