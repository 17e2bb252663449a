import { randomUUID } from 'node:crypto';
import { isCleanupError } from './errors.ts';
import type { Executor } from './executor.ts';
import {
  beginReclaim,
  endReclaim,
  type ReclaimTarget,
  ReclaimVerdict,
  type TombstoneOptions,
} from './reclaim-guard.ts';
import { type ListedSandbox, ReclaimRefusal, ReclaimRefusedError } from './reclaim-listing.ts';
import { release } from './release.ts';
import { deleteInFlightSeconds, deleteSettledBy } from './release-guard.ts';
import type { SandboxProvider } from './sandbox-provider.ts';
import { ReleaseOutcome } from './types.ts';

/**
 * The reclaimer: a garbage collector for sandboxes no scope owns (issue 13). One run:
 *
 *   1. list the provisioner's live sandboxes (a listing it cannot trust refuses the run);
 *   2. classify each against `sandbox_runtimes` and `agent_runs` in one read: a sandbox is leaked
 *      now when no scope whose row names it is active, fenced or has a delete in flight;
 *   3. refuse the run when more than RECLAIM_MAX_SHARE_PERCENT of the listing (at least
 *      SHARE_RULE_ALLOWANCE) looks leaked, or when no listed sandbox is named by any row (an empty
 *      or foreign database pointed at a live provisioner): nothing is recorded or deleted;
 *   4. record the streaks (`runtime_reclaim_sightings`): a sandbox leaked now keeps or starts its
 *      streak, every other sandbox loses it;
 *   5. delete, at most RECLAIM_MAX_PER_RUN, oldest streak first, those whose streak is at least
 *      RECLAIM_GRACE_SECONDS old and whose owning scopes (if any) have been idle that long, each
 *      behind the reclaim guard (one statement, just before its DELETE, never in a transaction)
 *      and through the release's own client, keyed lock and bounds.
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
         coalesce(g.first_seen_at <= now() - make_interval(secs => $3::float8), false) AS streak_old
  FROM listed l LEFT JOIN runtime_reclaim_sightings g ON g.sandbox_id = l.sandbox_id
  ORDER BY l.ord`;

/** Holds that end a streak: the scope owns the sandbox now. `scope_recent` only delays. */
const OWNING_HOLDS = new Set(['scope_active', 'scope_fenced', 'delete_in_flight']);

export async function classifyListing(
  db: Executor,
  listing: readonly ListedSandbox[],
  options: { graceSeconds: number },
): Promise<ClassifiedSandbox[]> {
  if (listing.length === 0) return [];
  const { rows } = await db.query<{
    sandbox_id: string;
    first_seen_at: Date | null;
    owners: SandboxOwner[];
    streak_old: boolean;
  }>(CLASSIFY, [
    listing.map((sandbox) => sandbox.sandboxId),
    listing.map((sandbox) => sandbox.generation),
    options.graceSeconds,
  ]);
  return rows.map((row, index) => {
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
 * trusted listing.
 */
const RECORD_SIGHTINGS = `
  WITH leaked AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]) AS l(sandbox_id, generation, identity)
  ), forgotten AS (
    DELETE FROM runtime_reclaim_sightings g
    WHERE NOT EXISTS (SELECT 1 FROM leaked l WHERE l.sandbox_id = g.sandbox_id)
      AND (g.reclaim_in_flight_until IS NULL OR g.reclaim_in_flight_until <= clock_timestamp())
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

export async function recordSightings(db: Executor, leaked: readonly ListedSandbox[]): Promise<void> {
  // Repeating it (a lost answer) changes nothing: the same streaks, last_seen_at a moment later.
  await db.query(RECORD_SIGHTINGS, [
    leaked.map((sandbox) => sandbox.sandboxId),
    leaked.map((sandbox) => sandbox.generation),
    leaked.map((sandbox) => sandbox.identity ?? null),
  ]);
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
}

export interface ReclaimDeps {
  db: Executor;
  provider: SandboxProvider;
  /** Reports each decision as it is made (the handler logs and counts). */
  onEvent?: (event: ReclaimEvent) => void;
}

export type ReclaimEvent =
  | {
      kind: 'reclaimed';
      sandbox: ClassifiedSandbox;
      outcome: ReleaseOutcome;
      generation: number;
    }
  | {
      kind: 'skipped';
      sandbox: ClassifiedSandbox;
      verdict: string;
      uid: string | null;
      runtimeScopeId: string | null;
    }
  | { kind: 'unconfirmed'; sandbox: ClassifiedSandbox; why: string }
  | { kind: 'failed'; sandbox: ClassifiedSandbox; error: unknown };

export interface ReclaimPlan {
  listed: number;
  classified: ClassifiedSandbox[];
  leaked: ClassifiedSandbox[];
  /** What this run would delete, in order (at most maxPerRun). */
  due: ClassifiedSandbox[];
  /** Due but over the per-run bound: next run. */
  deferred: number;
}

export interface ReclaimReport extends ReclaimPlan {
  reclaimed: number;
  skipped: number;
  failed: number;
  /** Age of the oldest streak still open after this run (seconds; 0 when none). */
  oldestLeakAgeSeconds: number;
}

/**
 * Steps 2 and 3 (read only): what a run would do now. `ops orphans` shows it; `reclaim` acts on it.
 * Throws ReclaimRefusedError(share_exceeded | no_known_sandboxes) when the listing looks like a runaway.
 */
export async function planReclaim(
  db: Executor,
  listing: readonly ListedSandbox[],
  settings: Pick<ReclaimSettings, 'graceSeconds' | 'maxPerRun' | 'maxSharePercent'>,
): Promise<ReclaimPlan> {
  const classified = await classifyListing(db, listing, { graceSeconds: settings.graceSeconds });
  const leaked = classified.filter((sandbox) => sandbox.leaked);
  const known = classified.filter((sandbox) => sandbox.owners.length > 0).length;
  refuseRunaway(listing.length, leaked.length, settings.maxSharePercent, known);
  const due = leaked
    .filter((sandbox) => sandbox.waiting === null)
    .sort((a, b) => a.firstSeenAt!.getTime() - b.firstSeenAt!.getTime());
  return {
    listed: listing.length,
    classified,
    leaked,
    due: due.slice(0, settings.maxPerRun),
    deferred: Math.max(0, due.length - settings.maxPerRun),
  };
}

/**
 * Refuses a listing this database cannot be the right one for. `known`: listed sandboxes some
 * `sandbox_runtimes` row names. RECLAIM_MAX_SHARE_PERCENT=100 turns both checks off (the operator
 * trusts the database completely).
 */
export function refuseRunaway(listed: number, leaked: number, maxSharePercent: number, known: number): void {
  if (maxSharePercent >= 100) return;
  // A database that names none of a fleet (a wrong DATABASE_URL, a branch restored to before those
  // rows) would see every sandbox as leaked; a share alone lets a small fleet through.
  if (listed > 0 && known === 0) {
    throw new ReclaimRefusedError(
      ReclaimRefusal.NO_KNOWN_SANDBOXES,
      `none of the ${listed} listed sandboxes is named by any sandbox_runtimes row: ` +
        'is this the right database and the right provisioner? nothing was recorded or deleted',
      { listed, leaked, known },
    );
  }
  const allowed = Math.max(Math.ceil((listed * maxSharePercent) / 100), SHARE_RULE_ALLOWANCE);
  if (leaked > allowed) {
    throw new ReclaimRefusedError(
      ReclaimRefusal.SHARE_EXCEEDED,
      `${leaked} of ${listed} listed sandboxes look leaked, more than RECLAIM_MAX_SHARE_PERCENT=${maxSharePercent}%: ` +
        'is this the right database and the right provisioner? nothing was recorded or deleted',
      { listed, leaked, maxSharePercent, allowed },
    );
  }
}

/** One whole run (steps 2 to 5) on a listing already fetched and parsed. */
export async function reclaimLeaked(
  deps: ReclaimDeps,
  listing: readonly ListedSandbox[],
  settings: ReclaimSettings,
): Promise<ReclaimReport> {
  const { db } = deps;
  const firstPlan = await planReclaim(db, listing, settings);
  await recordSightings(db, firstPlan.leaked);
  // The streaks as the database now holds them (a first sighting begins at this listing).
  const { rows } = await db.query<{ sandbox_id: string; first_seen_at: Date; old_enough: boolean }>(STREAKS, [
    firstPlan.leaked.map((sandbox) => sandbox.sandboxId),
    settings.graceSeconds,
  ]);
  const streaks = new Map(rows.map((row) => [row.sandbox_id, row]));
  const due = firstPlan.leaked
    .filter((sandbox) => sandbox.waiting === null && streaks.get(sandbox.sandboxId)?.old_enough)
    .sort((a, b) => a.firstSeenAt!.getTime() - b.firstSeenAt!.getTime());
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
  };
}

/** The guard, then the DELETE (no transaction open), then the end of this attempt's records. */
export async function reclaimOne(
  deps: ReclaimDeps,
  sandbox: ClassifiedSandbox,
  settings: ReclaimSettings,
): Promise<ReclaimEvent> {
  const { db, provider } = deps;
  const target = { sandboxId: sandbox.sandboxId, generation: sandbox.deleteGeneration };
  const token = `reclaim:${randomUUID()}`;
  const inFlightSeconds = deleteInFlightSeconds(
    settings.runtimeCleanupTimeoutMs,
    settings.provisionerDeleteTimeoutSeconds,
  );
  // The quarantine's end on this clock, read before the guard: the database set its deadline
  // later than this, so this never overstates it, whatever the skew between the two clocks.
  const protectedUntilMs = Date.now() + inFlightSeconds * 1000;
  let guard: Awaited<ReturnType<typeof beginReclaim>>;
  try {
    guard = await beginReclaim(db, target, {
      graceSeconds: settings.graceSeconds,
      inFlightSeconds,
      lockTimeoutMs: settings.lockTimeoutMs,
      token,
    });
  } catch (error) {
    return { kind: 'failed', sandbox, error };
  }
  if (guard.verdict !== ReclaimVerdict.PROCEED) {
    return {
      kind: 'skipped',
      sandbox,
      verdict: guard.verdict,
      uid: guard.uid,
      runtimeScopeId: guard.runtimeScopeId,
    };
  }
  // Never send a DELETE that may act after its quarantine ended: the release may take its whole
  // bound, and the provisioner may act for its delete timeout after that. A worker frozen between
  // the guard and here (a Lambda environment frozen and thawed later) gives up; nothing was sent.
  if (
    Date.now() + settings.runtimeCleanupTimeoutMs + settings.provisionerDeleteTimeoutSeconds * 1000 >
    protectedUntilMs
  ) {
    return endOrFail(deps, sandbox, target, token, false, undefined, {
      kind: 'unconfirmed',
      sandbox,
      why: 'the guard answered too late: the DELETE could still act after its quarantine ends; not sent',
    });
  }
  // The owner's scope key when there is one: in one process the reclaim and a release of the same
  // scope never overlap. An unrecorded sandbox has no scope; its id is its key.
  const owner = sandbox.owners[0];
  let outcome: ReleaseOutcome;
  try {
    const result = await release(
      {
        runId: 'reclaimer',
        uid: owner?.uid ?? '',
        runtimeScopeId: owner?.runtimeScopeId ?? `sandbox:${sandbox.sandboxId}`,
        sandboxId: sandbox.sandboxId,
        generation: sandbox.deleteGeneration,
        workdirPath: '',
        fenceSetAt: null,
      },
      { provider, runtimeCleanupTimeoutMs: settings.runtimeCleanupTimeoutMs },
    );
    outcome = result.outcome;
  } catch (error) {
    // Answered (a 4xx, a refused connection, a lock timeout): nothing of it can act any more.
    // Otherwise the records stay until their deadline: the provisioner may still carry it out, so
    // admissions to an owning scope and platform records of the id stay refused. The next run
    // may send the DELETE again meanwhile (for an unrecorded sandbox; an owned one waits for the
    // record through its scope's delete_in_flight hold): two DELETEs of one leaked sandbox remove
    // the same thing, and the guard renews the record for the second.
    if (deleteSettledBy(error)) await endReclaim(db, target, token, false).catch(() => {});
    return { kind: 'failed', sandbox, error };
  }
  return endAfterAnswer(deps, sandbox, settings, target, token, outcome);
}

/** The end of an answered reclaim: confirmed, or not (a 409 that does not name what was listed). */
function endAfterAnswer(
  deps: ReclaimDeps,
  sandbox: ClassifiedSandbox,
  settings: ReclaimSettings,
  target: ReclaimTarget,
  token: string,
  outcome: ReleaseOutcome,
): Promise<ReclaimEvent> {
  // A 409 naming a newer generation means "the generation you named is gone". Only when the
  // listing gave that generation was it the sandbox listed; a generation from the database (or a
  // guess) names an older container, and the live one is a newer, unrecorded one: not a
  // confirmation, the sighting and its streak stay.
  if (outcome === ReleaseOutcome.SUPERSEDED && !sandbox.generationListed) {
    return endOrFail(deps, sandbox, target, token, false, undefined, {
      kind: 'unconfirmed',
      sandbox,
      why: sandbox.generationGuessed
        ? 'the provisioner answered 409 with a newer generation to a DELETE whose generation was unknown (a listing without generation, of a sandbox no row names): the sandbox may still be live'
        : 'the provisioner answered 409 with a newer generation than the one the database records (the listing gave none): a newer, unrecorded container may still be live',
    });
  }
  return endOrFail(
    deps,
    sandbox,
    target,
    token,
    true,
    { generationKnown: !sandbox.generationGuessed, seconds: settings.graceSeconds },
    { kind: 'reclaimed', sandbox, outcome, generation: sandbox.deleteGeneration },
  );
}

/**
 * Ends the attempt's records and reports `event`; a failure to end them (Neon restarting the
 * compute) is this sandbox's `failed` event, never the run's: the records simply run to their
 * deadline, and the other workers carry on.
 */
async function endOrFail(
  deps: ReclaimDeps,
  sandbox: ClassifiedSandbox,
  target: ReclaimTarget,
  token: string,
  confirmed: boolean,
  tombstone: TombstoneOptions | undefined,
  event: ReclaimEvent,
): Promise<ReclaimEvent> {
  try {
    await endReclaim(deps.db, target, token, confirmed, tombstone);
  } catch (error) {
    return { kind: 'failed', sandbox, error };
  }
  return event;
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
  deps: { db: Executor; lister: SandboxLister },
  settings: Pick<ReclaimSettings, 'graceSeconds' | 'maxPerRun' | 'maxSharePercent'> & ListingSettings,
): Promise<ReclaimPlan> {
  const listing = await deps.lister.listSandboxes({ timeoutMs: settings.listTimeoutMs });
  return planReclaim(deps.db, listing, settings);
}
