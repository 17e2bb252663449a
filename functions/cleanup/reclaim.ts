import { randomUUID } from 'node:crypto';
import { isCleanupError } from './errors.ts';
import { type Database, type Executor, WAIT_FOR_ROW_LOCKS } from './executor.ts';
import {
  type DeleteEnding,
  deleteBehindGuard,
  deleteInFlightSeconds,
  residualDeleteSeconds,
} from './guarded-delete.ts';
import {
  beginReclaim,
  endReclaim,
  ReclaimEnding,
  type ReclaimTarget,
  ReclaimVerdict,
} from './reclaim-guard.ts';
import { type ListedSandbox, ReclaimRefusal, ReclaimRefusedError } from './reclaim-listing.ts';
import type { SandboxProvider } from './sandbox-provider.ts';
import { ReleaseOutcome } from './types.ts';

/**
 * The reclaimer: a garbage collector for sandboxes no scope owns (issue 13). One run:
 *
 *   1. list the provisioner's live sandboxes (a listing it cannot trust refuses the run);
 *   2. classify each against `sandbox_runtimes` and `agent_runs` in one read: a sandbox is leaked
 *      now when no scope whose row names it is active, fenced or has a delete in flight;
 *   3. refuse the run when this database and this provisioner may not belong together: no listed
 *      sandbox is named by any row, or more than RECLAIM_MAX_SHARE_PERCENT of the listing (at least
 *      SHARE_RULE_ALLOWANCE) looks leaked — unless a healthy listing of this provisioner, or one
 *      naming sandboxes rows here name, confirmed the pairing within PAIRING_EVIDENCE_MAX_AGE_SECONDS
 *      (a quiet fleet, whose only live sandboxes are leaks): nothing is recorded or deleted;
 *   4. record the streaks (`runtime_reclaim_sightings`): a sandbox leaked now keeps or starts its
 *      streak, every other sandbox loses it;
 *   5. delete, at most RECLAIM_MAX_PER_RUN, oldest streak first, those whose streak is at least
 *      RECLAIM_GRACE_SECONDS old and whose owning scopes (if any) have been idle that long, each
 *      through the one delete path release uses too (guarded-delete.ts: the reclaim guard, the
 *      release's own client, keyed lock and bounds, and the same settle rules).
 *
 * The grace and the delete bounds are never below the deployment's (settings of record: the
 * deployed reclaimer records its own at every run, and the guard applies the larger), so an
 * operator's `ops reclaim` from a shell with other values cannot act more eagerly than the stage.
 *
 * Unlike an idle reaper it never deletes a sandbox because it is quiet: a scope with a run, a
 * fence or a delete in flight owns its sandbox however long it has been idle.
 */

/**
 * The share rule's absolute allowance: a run may always reclaim this many at once, whatever the
 * share, so a tiny fleet (two listed, one leaked) can still reclaim its leak. Every listing is
 * checked: the allowed number of leaked sandboxes is max(ceil(share x listed), this).
 */
export const SHARE_RULE_ALLOWANCE = 2;

/**
 * How long a healthy listing vouches for the pairing of this database and this provisioner: a quiet
 * fleet (every run ended, the only live sandboxes leaks) fails both brakes on every listing, and
 * must still be reclaimed after a night or a weekend. A database paired with another provisioner
 * has no evidence for that provisioner's URL at all; one restored from a backup keeps its old
 * evidence, and docs/reclaiming.md says what to do then.
 */
export const PAIRING_EVIDENCE_MAX_AGE_SECONDS = 7 * 24 * 3600;

/**
 * The most of a listing that may look leaked for it to count as pairing evidence, whatever
 * RECLAIM_MAX_SHARE_PERCENT says (its default): a listing an operator let through with the brakes
 * off vouches for nothing.
 */
export const EVIDENCE_MAX_SHARE_PERCENT = 50;

/** Deletes of one run in flight at once: the provisioner sees a trickle, never a burst. */
export const RECLAIM_DELETE_CONCURRENCY = 4;

/** Why a sandbox counted as leaked (logged with every reclaim, shown by `ops orphans`). */
export const LeakReason = {
  /** No sandbox_runtimes row names it: created and never recorded (a crash between create and record), or its scope moved to another sandbox id. */
  UNRECORDED: 'unrecorded',
  /** A row names this generation, unreleased, but its scope has had no run and no fence for the grace: a forced clear whose DELETE was never sent, or a fence never raised. */
  CLEANUP_NEVER_RAN: 'cleanup_never_ran',
  /** The cleanup confirmed this generation gone (a 404), yet the provisioner still lists it. */
  KEPT_AFTER_RELEASE: 'kept_after_release',
  /** The listed generation is not the one its scope records: replaced without a cleanup. */
  GENERATION_UNRECORDED: 'generation_unrecorded',
} as const;
export type LeakReason = (typeof LeakReason)[keyof typeof LeakReason];

export interface SandboxOwner {
  uid: string;
  runtimeScopeId: string;
  generation: number;
  released: boolean;
  /** Why this scope keeps the sandbox now, or null (runtime_reclaim_scope_hold). */
  hold: string | null;
}

export interface ClassifiedSandbox extends ListedSandbox {
  owners: SandboxOwner[];
  /** No owner is active, fenced or has a delete in flight. */
  leaked: boolean;
  reason: LeakReason | null;
  /** Why it is not (yet) reclaimable, or null when it is. */
  waiting: string | null;
  /** When its current streak began (before this listing), or null. */
  firstSeenAt: Date | null;
  /** The generation a DELETE would name. */
  deleteGeneration: number;
  /** True when neither the listing nor the database gave a generation (0 is sent). */
  generationGuessed: boolean;
  /** True when the listing gave the generation: only then does a 409 naming a newer one confirm. */
  generationListed: boolean;
}

const CLASSIFY = `
  WITH listed AS (
    SELECT l.sandbox_id, l.generation, l.ord
    FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS l(sandbox_id, generation, ord)
  )
  SELECT l.sandbox_id, g.first_seen_at,
         coalesce((
           SELECT json_agg(json_build_object(
                    'uid', s.uid, 'runtimeScopeId', s.runtime_scope_id, 'generation', s.generation,
                    'released', runtime_cleanup_generation_released(
                                  s.released_at, s.released_sandbox_id, s.released_generation,
                                  s.sandbox_id, s.generation),
                    'hold', runtime_reclaim_scope_hold(s.uid, s.runtime_scope_id, $3::float8))
                  ORDER BY s.uid, s.runtime_scope_id)
           FROM sandbox_runtimes s
           WHERE s.sandbox_id = l.sandbox_id OR s.delete_in_flight_sandbox_id = l.sandbox_id
         ), '[]'::json) AS owners,
         coalesce(g.first_seen_at <= now() - make_interval(secs => $3::float8), false) AS streak_old,
         (SELECT p.confirmed_at FROM runtime_reclaim_pairings p WHERE p.provisioner = $4::text) AS paired_at
  FROM listed l LEFT JOIN runtime_reclaim_sightings g ON g.sandbox_id = l.sandbox_id
  ORDER BY l.ord`;

/** Holds that end a streak: the scope owns the sandbox now. `scope_recent` only delays. */
const OWNING_HOLDS = new Set(['scope_active', 'scope_fenced', 'delete_in_flight']);

export interface Classification {
  sandboxes: ClassifiedSandbox[];
  /** The last time this provisioner's pairing with this database was confirmed, or null. */
  pairedAt: Date | null;
}

export async function classifyListing(
  db: Executor,
  listing: readonly ListedSandbox[],
  options: { graceSeconds: number; provisioner: string },
): Promise<Classification> {
  if (listing.length === 0) return { sandboxes: [], pairedAt: null };
  const { rows } = await db.query<{
    sandbox_id: string;
    first_seen_at: Date | null;
    owners: SandboxOwner[];
    streak_old: boolean;
    paired_at: Date | null;
  }>(CLASSIFY, [
    listing.map((sandbox) => sandbox.sandboxId),
    listing.map((sandbox) => sandbox.generation),
    options.graceSeconds,
    options.provisioner,
  ]);
  const pairedAt = rows[0]?.paired_at ? new Date(rows[0].paired_at) : null;
  const sandboxes = rows.map((row, index) => {
    const listed = listing[index]!;
    const owners = row.owners.map((owner) => ({ ...owner, generation: Number(owner.generation) }));
    const owningHold = owners.find((owner) => owner.hold !== null && OWNING_HOLDS.has(owner.hold));
    const leaked = owningHold === undefined;
    const recent = owners.find((owner) => owner.hold === 'scope_recent');
    const firstSeenAt = row.first_seen_at ? new Date(row.first_seen_at) : null;
    const streakOld = row.streak_old;
    const known = listed.generation ?? owners[0]?.generation ?? null;
    return {
      ...listed,
      owners,
      leaked,
      reason: leaked ? leakReason(listed, owners) : null,
      waiting: !leaked
        ? `owned: ${owningHold!.hold} (${owningHold!.uid}/${owningHold!.runtimeScopeId})`
        : recent
          ? `scope ${recent.uid}/${recent.runtimeScopeId} active less than the grace ago`
          : !streakOld
            ? firstSeenAt
              ? `seen leaked since ${firstSeenAt.toISOString()}, less than the grace`
              : 'first seen leaked on this listing'
            : null,
      firstSeenAt,
      deleteGeneration: known ?? 0,
      generationGuessed: known === null,
      generationListed: listed.generation !== null,
    };
  });
  return { sandboxes, pairedAt };
}

/**
 * Oldest streak first. A due leak's streak is a grace old, so the database holds its start; one
 * that reads as missing or unreadable (a driver that could not parse the timestamp's text) is a
 * clear error here, never a TypeError inside the sort or an order decided by NaN.
 */
function byStreakStart(a: ClassifiedSandbox, b: ClassifiedSandbox): number {
  return streakStart(a) - streakStart(b);
}

function streakStart(sandbox: ClassifiedSandbox): number {
  const at = sandbox.firstSeenAt?.getTime();
  if (at === undefined || Number.isNaN(at)) {
    throw new Error(
      `reclaim: the due sandbox ${sandbox.sandboxId} has no readable streak start (first_seen_at read as ${String(sandbox.firstSeenAt)})`,
    );
  }
  return at;
}

function leakReason(listed: ListedSandbox, owners: SandboxOwner[]): LeakReason {
  if (owners.length === 0) return LeakReason.UNRECORDED;
  const same = owners.filter((owner) => listed.generation === null || owner.generation === listed.generation);
  if (same.some((owner) => !owner.released)) return LeakReason.CLEANUP_NEVER_RAN;
  if (same.length > 0) return LeakReason.KEPT_AFTER_RELEASE;
  return LeakReason.GENERATION_UNRECORDED;
}

/**
 * Records this listing's streaks in one statement: a sandbox leaked now keeps its row (or gets
 * one), every other row goes (owned now, or not listed any more). Only ever called with a full,
 * trusted listing. A healthy listing (`evidence` set) also confirms the pairing of this database
 * with this provisioner, in the same statement.
 */
const RECORD_SIGHTINGS = `
  WITH leaked AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]) AS l(sandbox_id, generation, identity)
  ), forgotten AS (
    DELETE FROM runtime_reclaim_sightings g
    WHERE NOT EXISTS (SELECT 1 FROM leaked l WHERE l.sandbox_id = g.sandbox_id)
      AND (g.reclaim_in_flight_until IS NULL OR g.reclaim_in_flight_until <= clock_timestamp())
    RETURNING 1
  ), paired AS (
    INSERT INTO runtime_reclaim_pairings (provisioner, confirmed_at, evidence)
    SELECT $4::text, now(), $5::text WHERE $5::text IS NOT NULL
    ON CONFLICT (provisioner) DO UPDATE SET confirmed_at = EXCLUDED.confirmed_at, evidence = EXCLUDED.evidence
    RETURNING 1
  )
  INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation, listed_identity, first_seen_at, last_seen_at)
  SELECT l.sandbox_id, l.generation, l.identity, now(), now() FROM leaked l
  ON CONFLICT (sandbox_id) DO UPDATE
    SET last_seen_at = now(),
        listed_generation = EXCLUDED.listed_generation,
        listed_identity = EXCLUDED.listed_identity,
        -- A different generation, or a different URL or creation time, is a different container
        -- (created again under the same id): its streak starts now.
        first_seen_at = CASE
          WHEN runtime_reclaim_sightings.listed_generation IS DISTINCT FROM EXCLUDED.listed_generation
            OR runtime_reclaim_sightings.listed_identity IS DISTINCT FROM EXCLUDED.listed_identity
            THEN now() ELSE runtime_reclaim_sightings.first_seen_at END`;

export async function recordSightings(
  db: Pick<Database, 'transact'>,
  leaked: readonly ListedSandbox[],
  pairing: { provisioner: string; evidence: string | null },
): Promise<void> {
  // Repeating it (a lost answer) changes nothing: the same streaks, last_seen_at a moment later.
  // In a READ COMMITTED transaction of its own (Database.transact): its upserts meet the rows a
  // guard or the platform's trigger is writing, and under a REPEATABLE READ default that meeting
  // ended in SQLSTATE 40001 and the run recorded nothing.
  await db.transact(
    RECORD_SIGHTINGS,
    [
      leaked.map((sandbox) => sandbox.sandboxId),
      leaked.map((sandbox) => sandbox.generation),
      leaked.map((sandbox) => sandbox.identity ?? null),
      pairing.provisioner,
      pairing.evidence,
    ],
    WAIT_FOR_ROW_LOCKS,
  );
}

/** Reads the streaks again after recording them: when each began (the database's clock). */
const STREAKS = `
  SELECT sandbox_id, first_seen_at, now() - first_seen_at >= make_interval(secs => $2::float8) AS old_enough
  FROM runtime_reclaim_sightings WHERE sandbox_id = ANY ($1::text[])`;

export interface ReclaimSettings {
  graceSeconds: number;
  maxPerRun: number;
  maxSharePercent: number;
  runtimeCleanupTimeoutMs: number;
  provisionerDeleteTimeoutSeconds: number;
  lockTimeoutMs: number;
  /**
   * No DELETE starts after this (epoch ms): a scheduled run ends inside its Lambda's time, and
   * what it did not reach stays leaked for the next run.
   */
  startDeletesBeforeMs?: number;
  /**
   * Set by the deployment's own reclaimer (the scheduled function, the local stack): it records
   * these settings as the settings of record, under this name. An operator's tool leaves it unset
   * and only reads them.
   */
  recordAs?: string;
}

/**
 * The deployment's settings a run may not weaken (runtime_cleanup_settings): the grace and the
 * delete bounds no shorter, the brakes (the share and the per-run bound) no looser.
 */
export interface SettingsOfRecord {
  /** What this run applies: each of its own settings, or the recorded one where that is stricter. */
  effective: ReclaimSettings;
  /** What was recorded, by whom and when (empty when no deployment has recorded any). */
  recorded: Array<{ name: string; value: number; recordedAt: string; recordedBy: string }>;
  /** The settings in which this run's own values were replaced by the stricter recorded ones. */
  tightened: string[];
}

const SETTINGS_OF_RECORD = `
  SELECT name, value, to_json(recorded_at) #>> '{}' AS recorded_at, recorded_by
  FROM runtime_cleanup_settings_of_record($1::jsonb, $2::text)`;

/**
 * The recorded names, how each is derived from a run's own settings, and which way is stricter:
 * a longer grace, hold or bound (`max`), a smaller share or per-run bound (`min`). The record
 * itself keeps the stricter value for a while by the same directions
 * (infra/sql/runtime_cleanup_settings_of_record.sql says why).
 */
function recordableSettings(
  settings: ReclaimSettings,
): Record<string, { value: number; stricter: 'max' | 'min' }> {
  const longer = (value: number) => ({ value, stricter: 'max' as const });
  const fewer = (value: number) => ({ value, stricter: 'min' as const });
  return {
    reclaim_grace_seconds: longer(settings.graceSeconds),
    // The guard's record covers the attempt's bound, its own lock wait, the provisioner's delete
    // time and the margin; the residual is what an unanswered DELETE keeps (guarded-delete.ts).
    reclaim_hold_seconds: longer(
      deleteInFlightSeconds(
        settings.runtimeCleanupTimeoutMs,
        settings.provisionerDeleteTimeoutSeconds,
        settings.lockTimeoutMs,
      ),
    ),
    reclaim_residual_seconds: longer(residualDeleteSeconds(settings.provisionerDeleteTimeoutSeconds)),
    runtime_cleanup_timeout_seconds: longer(settings.runtimeCleanupTimeoutMs / 1000),
    provisioner_delete_timeout_seconds: longer(settings.provisionerDeleteTimeoutSeconds),
    reclaim_max_share_percent: fewer(settings.maxSharePercent),
    reclaim_max_per_run: fewer(settings.maxPerRun),
  };
}

/**
 * Records this run's settings (`settings.recordAs`) or only reads what is recorded, in one
 * statement, and replaces each of the run's own settings by the recorded one where that is
 * stricter. The guard applies the same rule in the database to what it decides on (grace, hold,
 * residual), whoever calls it; this also lengthens the run's own DELETE bound and "too late" check
 * to the deployment's, and keeps its brakes no looser: an operator's shell with
 * RECLAIM_MAX_SHARE_PERCENT=100 cannot switch off the brakes of a deployment that keeps them.
 */
export async function settingsOfRecord(
  db: Pick<Database, 'transact'>,
  settings: ReclaimSettings,
): Promise<SettingsOfRecord> {
  const own = recordableSettings(settings);
  // Recording is an upsert of the same values: safe to repeat after a lost answer. In a READ
  // COMMITTED transaction (Database.transact): two reclaimers recording at once would otherwise,
  // under a REPEATABLE READ default, fail the second one with SQLSTATE 40001.
  const { rows } = await db.transact<{
    name: string;
    value: number;
    recorded_at: string;
    recorded_by: string;
  }>(
    SETTINGS_OF_RECORD,
    [
      JSON.stringify(Object.fromEntries(Object.entries(own).map(([name, { value }]) => [name, value]))),
      settings.recordAs ?? null,
    ],
    WAIT_FOR_ROW_LOCKS,
  );
  const recorded = new Map(rows.map((row) => [row.name, Number(row.value)]));
  const at = (name: string): number => {
    const mine = own[name]!;
    const theirs = recorded.get(name);
    if (theirs === undefined) return mine.value;
    // Only a hand-written row can hold one (the recording function refuses them); NaN would
    // switch a brake off (no count exceeds it), so nothing is decided on it.
    if (!Number.isFinite(theirs)) {
      throw new Error(
        `the setting of record ${name} is ${theirs}, not a finite number: correct or delete its row in runtime_cleanup_settings (the deployed reclaimer records it again at its next run)`,
      );
    }
    return mine.stricter === 'max' ? Math.max(mine.value, theirs) : Math.min(mine.value, theirs);
  };
  const tightened = Object.keys(own).filter((name) => at(name) !== own[name]!.value);
  return {
    effective: {
      ...settings,
      graceSeconds: at('reclaim_grace_seconds'),
      runtimeCleanupTimeoutMs: at('runtime_cleanup_timeout_seconds') * 1000,
      provisionerDeleteTimeoutSeconds: at('provisioner_delete_timeout_seconds'),
      maxSharePercent: at('reclaim_max_share_percent'),
      maxPerRun: at('reclaim_max_per_run'),
    },
    recorded: rows.map((row) => ({
      name: row.name,
      value: Number(row.value),
      recordedAt: row.recorded_at,
      recordedBy: row.recorded_by,
    })),
    tightened,
  };
}

/**
 * The settings a run applies that no deployment has recorded here: every one of them in a
 * database whose deployed reclaimer has not run yet. `ops reclaim --yes` refuses to act on its
 * shell's values for those unless told to (infra/ops/commands/reclaim.ts).
 */
export function unrecordedSettings(ofRecord: SettingsOfRecord): string[] {
  const recorded = new Set(ofRecord.recorded.map((row) => row.name));
  return Object.keys(recordableSettings(ofRecord.effective)).filter((name) => !recorded.has(name));
}

export interface ReclaimDeps {
  db: Pick<Database, 'query' | 'transact'>;
  provider: SandboxProvider;
  /**
   * The provisioner's identity for the pairing evidence: its base URL without credentials
   * (`provisionerIdentity`).
   */
  provisioner: string;
  /** Reports each decision as it is made (the handler logs and counts). */
  onEvent?: (event: ReclaimEvent) => void;
  /** The clock (epoch ms) the delete path checks its deadlines with; tests inject one. */
  now?: () => number;
}

/** The provisioner's identity for the pairing evidence: origin and path, no credentials or query. */
export function provisionerIdentity(baseUrl: string): string {
  const url = new URL(baseUrl);
  return `${url.protocol}//${url.host}${url.pathname.replace(/\/+$/, '')}`;
}

export type ReclaimEvent =
  | {
      kind: 'reclaimed';
      sandbox: ClassifiedSandbox;
      outcome: ReleaseOutcome;
      generation: number;
      /** The records could not be ended: they run to their deadlines (the sandbox is gone). */
      settleError?: unknown;
    }
  | {
      kind: 'skipped';
      sandbox: ClassifiedSandbox;
      verdict: string;
      uid: string | null;
      runtimeScopeId: string | null;
    }
  | { kind: 'unconfirmed'; sandbox: ClassifiedSandbox; why: string }
  | { kind: 'failed'; sandbox: ClassifiedSandbox; error: unknown; quarantined: boolean };

/** Why a run went ahead although a brake would have refused its listing on its own. */
export interface BrakeLifted {
  brake: typeof ReclaimRefusal.NO_KNOWN_SANDBOXES | typeof ReclaimRefusal.SHARE_EXCEEDED;
  /** When this provisioner's pairing with this database was last confirmed. */
  pairedAt: string;
}

export interface ReclaimPlan {
  listed: number;
  classified: ClassifiedSandbox[];
  leaked: ClassifiedSandbox[];
  /** What this run would delete, in order (at most maxPerRun). */
  due: ClassifiedSandbox[];
  /** Due but over the per-run bound: next run. */
  deferred: number;
  /** Set when pairing evidence lifted a brake (logged and counted by the caller). */
  brakeLifted: BrakeLifted | null;
  /** The listing passed both brakes on its own and names sandboxes rows here name. */
  healthy: boolean;
}

export interface ReclaimReport extends ReclaimPlan {
  reclaimed: number;
  skipped: number;
  failed: number;
  /** Age of the oldest streak still open after this run (seconds; 0 when none). */
  oldestLeakAgeSeconds: number;
  settings: SettingsOfRecord;
}

/**
 * Steps 2 and 3 (read only): what a run would do now. `ops orphans` shows it; `reclaim` acts on it.
 * Throws ReclaimRefusedError(share_exceeded | no_known_sandboxes) when the listing looks like a
 * wrong pairing and nothing recent vouches for it.
 */
export async function planReclaim(
  db: Executor,
  listing: readonly ListedSandbox[],
  settings: Pick<ReclaimSettings, 'graceSeconds' | 'maxPerRun' | 'maxSharePercent'>,
  provisioner: string,
): Promise<ReclaimPlan> {
  const { sandboxes: classified, pairedAt } = await classifyListing(db, listing, {
    graceSeconds: settings.graceSeconds,
    provisioner,
  });
  const leaked = classified.filter((sandbox) => sandbox.leaked);
  const known = classified.filter((sandbox) => sandbox.owners.length > 0).length;
  const brakes = checkBrakes({
    listed: listing.length,
    leaked: leaked.length,
    known,
    maxSharePercent: settings.maxSharePercent,
    pairedAt,
  });
  const due = leaked.filter((sandbox) => sandbox.waiting === null).sort(byStreakStart);
  return {
    listed: listing.length,
    classified,
    leaked,
    due: due.slice(0, settings.maxPerRun),
    deferred: Math.max(0, due.length - settings.maxPerRun),
    ...brakes,
  };
}

export interface BrakeInput {
  listed: number;
  leaked: number;
  /** Listed sandboxes some `sandbox_runtimes` row names. */
  known: number;
  maxSharePercent: number;
  /** When the pairing of this database with this provisioner was last confirmed, or null. */
  pairedAt: Date | null;
  /** The clock (epoch ms); tests inject one. */
  nowMs?: number;
}

/**
 * The brakes against a database paired with the wrong provisioner (a wrong DATABASE_URL, a branch
 * restored to before those rows, another platform's provisioner): such a database sees every
 * sandbox as leaked. A listing is refused when no listed sandbox is named by any row, or when more
 * than RECLAIM_MAX_SHARE_PERCENT of it (at least SHARE_RULE_ALLOWANCE) looks leaked — unless a
 * healthy listing of this very provisioner confirmed the pairing within
 * PAIRING_EVIDENCE_MAX_AGE_SECONDS: a quiet fleet, where every run has ended and the only live
 * sandboxes are leaks, fails both checks on every listing, and must still be reclaimed. A listing
 * is healthy when it passes both on its own. RECLAIM_MAX_SHARE_PERCENT=100 turns both brakes off
 * (the operator trusts the database completely), but such a listing is evidence only within
 * EVIDENCE_MAX_SHARE_PERCENT. Still bounded per run by RECLAIM_MAX_PER_RUN.
 */
export function checkBrakes(input: BrakeInput): { brakeLifted: BrakeLifted | null; healthy: boolean } {
  const { listed, leaked, known, maxSharePercent, pairedAt } = input;
  const allowedAt = (percent: number) => Math.max(Math.ceil((listed * percent) / 100), SHARE_RULE_ALLOWANCE);
  const allowed = allowedAt(maxSharePercent);
  const noneKnown = listed > 0 && known === 0;
  const shareExceeded = leaked > allowed;
  // Evidence is held to the brakes' own standard even where an operator turned them off.
  const healthy =
    listed > 0 && !noneKnown && leaked <= allowedAt(Math.min(maxSharePercent, EVIDENCE_MAX_SHARE_PERCENT));
  if (maxSharePercent >= 100 || (!noneKnown && !shareExceeded)) return { brakeLifted: null, healthy };
  const nowMs = input.nowMs ?? Date.now();
  const paired = pairedAt !== null && nowMs - pairedAt.getTime() <= PAIRING_EVIDENCE_MAX_AGE_SECONDS * 1000;
  const brake = noneKnown ? ReclaimRefusal.NO_KNOWN_SANDBOXES : ReclaimRefusal.SHARE_EXCEEDED;
  if (paired) return { brakeLifted: { brake, pairedAt: pairedAt.toISOString() }, healthy };
  const evidence = pairedAt
    ? `the pairing with this provisioner was last confirmed at ${pairedAt.toISOString()}, longer ago than ${PAIRING_EVIDENCE_MAX_AGE_SECONDS} s`
    : 'no listing of this provisioner has ever confirmed its pairing with this database';
  if (noneKnown) {
    throw new ReclaimRefusedError(
      ReclaimRefusal.NO_KNOWN_SANDBOXES,
      `none of the ${listed} listed sandboxes is named by any sandbox_runtimes row, and ${evidence}: ` +
        'is this the right database and the right provisioner? nothing was recorded or deleted',
      { listed, leaked, known, pairedAt: pairedAt?.toISOString() ?? null },
    );
  }
  throw new ReclaimRefusedError(
    ReclaimRefusal.SHARE_EXCEEDED,
    `${leaked} of ${listed} listed sandboxes look leaked, more than RECLAIM_MAX_SHARE_PERCENT=${maxSharePercent}%, and ${evidence}: ` +
      'is this the right database and the right provisioner? nothing was recorded or deleted',
    { listed, leaked, maxSharePercent, allowed, pairedAt: pairedAt?.toISOString() ?? null },
  );
}

/** One whole run (steps 2 to 5) on a listing already fetched and parsed. */
export async function reclaimLeaked(
  deps: ReclaimDeps,
  listing: readonly ListedSandbox[],
  ownSettings: ReclaimSettings,
): Promise<ReclaimReport> {
  const { db } = deps;
  const ofRecord = await settingsOfRecord(db, ownSettings);
  const settings = ofRecord.effective;
  const firstPlan = await planReclaim(db, listing, settings, deps.provisioner);
  await recordSightings(db, firstPlan.leaked, {
    provisioner: deps.provisioner,
    evidence: firstPlan.healthy
      ? `a listing of ${firstPlan.listed} sandboxes, ${firstPlan.classified.filter((sandbox) => sandbox.owners.length > 0).length} named by rows here, ${firstPlan.leaked.length} leaked`
      : null,
  });
  // The streaks as the database now holds them (a first sighting begins at this listing).
  const { rows } = await db.query<{ sandbox_id: string; first_seen_at: Date; old_enough: boolean }>(STREAKS, [
    firstPlan.leaked.map((sandbox) => sandbox.sandboxId),
    settings.graceSeconds,
  ]);
  const streaks = new Map(rows.map((row) => [row.sandbox_id, row]));
  const due = firstPlan.leaked
    .filter((sandbox) => sandbox.waiting === null && streaks.get(sandbox.sandboxId)?.old_enough)
    .sort(byStreakStart);
  const plan = {
    ...firstPlan,
    due: due.slice(0, settings.maxPerRun),
    deferred: Math.max(0, due.length - settings.maxPerRun),
  };

  let reclaimed = 0;
  let skipped = 0;
  let failed = 0;
  let outOfTime = 0;
  const queue = [...plan.due];
  const worker = async () => {
    for (let sandbox = queue.shift(); sandbox; sandbox = queue.shift()) {
      if (settings.startDeletesBeforeMs !== undefined && Date.now() >= settings.startDeletesBeforeMs) {
        outOfTime += 1;
        continue;
      }
      const event = await reclaimOne(deps, sandbox, settings);
      deps.onEvent?.(event);
      if (event.kind === 'reclaimed') reclaimed += 1;
      else if (event.kind === 'skipped') skipped += 1;
      else failed += 1;
    }
  };
  // Every worker settles before the run does: a run that returned with a DELETE still under way
  // would let it outlive the run (a frozen Lambda thawed later, a CLI that closed its client).
  const settled = await Promise.allSettled(
    Array.from({ length: Math.min(RECLAIM_DELETE_CONCURRENCY, queue.length) }, worker),
  );
  const rejected = settled.find((result) => result.status === 'rejected');
  if (rejected) throw rejected.reason;

  const oldest = await db.query<{ age: number }>(
    'SELECT coalesce(extract(epoch FROM now() - min(first_seen_at)), 0)::float8 AS age FROM runtime_reclaim_sightings',
  );
  return {
    ...plan,
    deferred: plan.deferred + outOfTime,
    reclaimed,
    skipped,
    failed,
    oldestLeakAgeSeconds: Math.round(oldest.rows[0]?.age ?? 0),
    settings: ofRecord,
  };
}

type ReclaimRefusedVerdict = Exclude<Awaited<ReturnType<typeof beginReclaim>>, { verdict: 'proceed' }>;

/**
 * One sandbox through the one delete path (guarded-delete.ts): the reclaim guard, then the DELETE
 * (no transaction open), then the end of this attempt's records, by the same rules as a release.
 */
export async function reclaimOne(
  deps: ReclaimDeps,
  sandbox: ClassifiedSandbox,
  settings: ReclaimSettings,
): Promise<ReclaimEvent> {
  const { db, provider } = deps;
  const target: ReclaimTarget = {
    sandboxId: sandbox.sandboxId,
    generation: sandbox.deleteGeneration,
    generationListed: sandbox.generationListed,
  };
  // The owner's scope key when there is one: in one process the reclaim and a release of the same
  // scope never overlap. An unrecorded sandbox has no scope; its id is its key.
  const owner = sandbox.owners[0];
  let attempt: Awaited<ReturnType<typeof deleteBehindGuard<string, ReclaimRefusedVerdict>>>;
  try {
    attempt = await deleteBehindGuard<string, ReclaimRefusedVerdict>({
      target: {
        runId: 'reclaimer',
        uid: owner?.uid ?? '',
        runtimeScopeId: owner?.runtimeScopeId ?? `sandbox:${sandbox.sandboxId}`,
        sandboxId: sandbox.sandboxId,
        generation: sandbox.deleteGeneration,
      },
      provider,
      boundMs: settings.runtimeCleanupTimeoutMs,
      provisionerDeleteTimeoutSeconds: settings.provisionerDeleteTimeoutSeconds,
      guardWaitMs: settings.lockTimeoutMs,
      ...(deps.now ? { now: deps.now } : {}),
      async guard(holdSeconds) {
        const guard = await beginReclaim(db, target, {
          graceSeconds: settings.graceSeconds,
          inFlightSeconds: holdSeconds,
          lockTimeoutMs: settings.lockTimeoutMs,
          token: `reclaim:${randomUUID()}`,
        });
        return guard.verdict === ReclaimVerdict.PROCEED
          ? { proceed: true, record: guard.token }
          : { proceed: false, refusal: guard };
      },
      settle: (token, ending) => {
        const { kind, residualSeconds } = reclaimEnding(ending, sandbox);
        return endReclaim(db, target, token, kind, residualSeconds);
      },
    });
  } catch (error) {
    // The guard itself failed (the database unreachable, its lock busy): nothing was recorded or
    // sent; the next run tries again.
    return { kind: 'failed', sandbox, error, quarantined: false };
  }
  switch (attempt.kind) {
    case 'refused':
      return {
        kind: 'skipped',
        sandbox,
        verdict: attempt.refusal.verdict,
        uid: attempt.refusal.uid,
        runtimeScopeId: attempt.refusal.runtimeScopeId,
      };
    case 'not_sent':
      return { kind: 'unconfirmed', sandbox, why: attempt.error.message };
    case 'failed':
      // The records keep the scope and the id quarantined while the DELETE may still act; the
      // next run may send it again meanwhile (for an unrecorded sandbox; an owned one waits for the
      // record through its scope's delete_in_flight hold): two DELETEs of one leaked sandbox
      // remove the same thing, and the guard renews the record for the second.
      return {
        kind: 'failed',
        sandbox,
        error: attempt.error,
        quarantined: attempt.residualSeconds !== undefined,
      };
    case 'answered': {
      const unconfirmed = unconfirmedBy(attempt.result.outcome, sandbox);
      if (unconfirmed) return { kind: 'unconfirmed', sandbox, why: unconfirmed };
      return {
        kind: 'reclaimed',
        sandbox,
        outcome: attempt.result.outcome,
        generation: sandbox.deleteGeneration,
        ...(attempt.settleError !== undefined ? { settleError: attempt.settleError } : {}),
      };
    }
  }
}

/**
 * A 409 naming a newer generation means "the generation you named is gone". Only when the listing
 * gave that generation was it the sandbox listed; a generation from the database (or a guess)
 * names an older container, and the live one is a newer, unrecorded one: not a confirmation, the
 * sighting and its streak stay.
 */
function unconfirmedBy(outcome: ReleaseOutcome, sandbox: ClassifiedSandbox): string | undefined {
  if (outcome !== ReleaseOutcome.SUPERSEDED || sandbox.generationListed) return undefined;
  return sandbox.generationGuessed
    ? 'the provisioner answered 409 with a newer generation to a DELETE whose generation was unknown (a listing without generation, of a sandbox no row names): the sandbox may still be live'
    : 'the provisioner answered 409 with a newer generation than the one the database records (the listing gave none): a newer, unrecorded container may still be live';
}

/** How the one delete path's ending reads for a reclaim's records. */
function reclaimEnding(
  ending: DeleteEnding,
  sandbox: ClassifiedSandbox,
): { kind: ReclaimEnding; residualSeconds?: number } {
  if (ending.kind === 'not_sent') return { kind: ReclaimEnding.NOT_SENT };
  const residual = ending.residualSeconds !== undefined ? { residualSeconds: ending.residualSeconds } : {};
  if (ending.kind === 'answered' && unconfirmedBy(ending.result.outcome, sandbox) === undefined) {
    return { kind: ReclaimEnding.CONFIRMED, ...residual };
  }
  return ending.residualSeconds !== undefined
    ? { kind: ReclaimEnding.MAY_STILL_ACT, ...residual }
    : { kind: ReclaimEnding.ANSWERED };
}

/** The ReclaimRefused dimension of a whole-run failure: its reason, or `error`. */
export function refusalReason(error: unknown): string {
  if (error instanceof ReclaimRefusedError) return error.reason;
  if (isCleanupError(error)) return error.code.toLowerCase();
  return 'error';
}

/** The provisioner's listing as the reclaimer needs it (adapters/provisioner-client.ts). */
export interface SandboxLister {
  listSandboxes(options: { timeoutMs: number; signal?: AbortSignal }): Promise<ListedSandbox[]>;
}

export interface ListingSettings {
  /** Bounds the listing request, headers and body (the provisioner delete timeout). */
  listTimeoutMs: number;
}

/** A whole scheduled run: list, then reclaim. Throws ReclaimRefusedError before any DELETE. */
export async function runReclaim(
  deps: ReclaimDeps & { lister: SandboxLister },
  settings: ReclaimSettings & ListingSettings,
): Promise<ReclaimReport> {
  const listing = await deps.lister.listSandboxes({ timeoutMs: settings.listTimeoutMs });
  return reclaimLeaked(deps, listing, settings);
}

/** The dry run (`ops orphans`): list and classify, record nothing, delete nothing. */
export async function planOrphans(
  deps: { db: Executor & Pick<Database, 'transact'>; lister: SandboxLister; provisioner: string },
  settings: ReclaimSettings & ListingSettings,
): Promise<ReclaimPlan & { settings: SettingsOfRecord }> {
  const listing = await deps.lister.listSandboxes({ timeoutMs: settings.listTimeoutMs });
  const ofRecord = await settingsOfRecord(deps.db, { ...settings, recordAs: undefined } as ReclaimSettings);
  return {
    ...(await planReclaim(deps.db, listing, ofRecord.effective, deps.provisioner)),
    settings: ofRecord,
  };
}
