/**
 * The reclaimer under chaos (issue 13): leak injection, and invariant GC, "nothing the reclaimer
 * deletes was owned by an active or fenced scope at the moment of the DELETE".
 *
 * Leak injection: while the runs execute, sandboxes are created at the provisioner and never
 * recorded (what a platform crash between POST /api/sandboxes and recording the generation leaves
 * behind), at random moments. The stack's reclaimer (interval and grace shortened by
 * RECLAIM_CHAOS_ENV) must find and delete every one of them, while the chaos runs' own sandboxes,
 * faults and forced clears go on around it.
 *
 * Invariant GC, checked on every DELETE the provisioner receives, while it is in flight — and, for a
 * DELETE the provisioner answered early (202, 200 "deleting") and carried out later, once more at
 * the moment the container really goes, as invariant 2b is timed for a DELETE its client gave up
 * on (the quarantine must last until then: reclaimer bug 2): a DELETE
 * is the reclaimer's when the sandbox's sighting carries a live reclaim-in-flight record (the
 * reclaim guard writes it, in its own committed statement, before the request is sent). For such a
 * DELETE, every scope that owns the sandbox, by the database (a sandbox_runtimes row naming it)
 * or by the harness (the scope the chaos runs acquired it for), must have no non-terminal run and
 * no raised root fence at that moment. Reclaim DELETEs are then left out of invariants 2a and 2b,
 * which judge the fence protocol's deletes (a reclaim DELETE follows no fence check by design).
 */
import { randomUUID } from 'node:crypto';
import type { Database } from '../../functions/adapters/database.ts';
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import { preciseNow } from './clock.ts';
import { type DeleteRequest, Invariant, type Violation } from './invariants.ts';
import type { ScopePool } from './platform-ops.ts';
import type { Rng } from './random.ts';

/** The reclaimer's settings under chaos: a sandbox is reclaimed seconds after it leaks. */
export const RECLAIM_CHAOS_ENV = {
  // Every 2 s: often enough to reclaim within the final drain, rarely enough not to crowd the
  // database the suite's own probes use on a loaded two-core machine.
  RECLAIM_INTERVAL_SECONDS: '2',
  RECLAIM_GRACE_SECONDS: '2',
  // The brakes (RECLAIM_MAX_SHARE_PERCENT, RECLAIM_MAX_PER_RUN) stay at the product's defaults: a
  // chaos run keeps few sandboxes live at once and the injected leaks may be most of a listing, or
  // all of it in a quiet window (reclaimer.quiet_fleet), which the pairing evidence of the busy
  // listings must let through, as it must in production.
} as const;

const RECLAIM_IN_FLIGHT = `
  SELECT 1 FROM runtime_reclaim_sightings
  WHERE sandbox_id = $1::text AND reclaim_in_flight_until > clock_timestamp()`;

/** Every scope the database says owns the sandbox, with what would make the DELETE wrong. */
const OWNERS_NOW = `
  WITH owners AS (
    SELECT uid, runtime_scope_id FROM sandbox_runtimes WHERE sandbox_id = $1::text
    UNION
    SELECT $2::text, $3::text WHERE $2::text IS NOT NULL
  )
  SELECT o.uid, o.runtime_scope_id,
         (SELECT a.id FROM agent_runs a WHERE a.uid = o.uid AND a.runtime_scope_id = o.runtime_scope_id
            AND runtime_cleanup_status_is_active(a.status) LIMIT 1) AS active_run,
         (SELECT a.id FROM agent_runs a WHERE a.uid = o.uid AND a.runtime_scope_id = o.runtime_scope_id
            AND a.runtime_cleanup_pending AND a.run_type <> 'subagent' LIMIT 1) AS fenced_run
  FROM owners o`;

export interface ReclaimDeleteMark {
  sandboxId: string;
  generation: number | undefined;
  atMs: number;
}

export interface ReclaimChaosReport {
  leaksInjected: number;
  leaksReclaimed: number;
  leaksStillLive: string[];
  reclaimDeletes: number;
  /** Reclaim DELETEs whose sandbox some scope owned (database or harness), judged idle. */
  ownedChecked: number;
  /** Reclaim DELETEs answered early and judged again when the provisioner carried them out. */
  carriedOutLaterChecked: number;
  violations: Violation[];
}

export interface ReclaimChaos {
  readonly violations: Violation[];
  /** Whether a DELETE of the history was the reclaimer's (left out of 2a and 2b). */
  isReclaimDelete(request: DeleteRequest): boolean;
  /** Stops injecting; waits until every injected leak is gone or the deadline passes. */
  settle(deadlineMs: number): Promise<ReclaimChaosReport>;
}

export function installReclaimChaos(input: {
  provisioner: LocalProvisioner;
  probeDb: Database;
  scopes: ScopePool;
  rng: Rng;
  /** Mean time between two injected leaks while the runs execute. */
  meanLeakIntervalMs?: number;
  onHarnessError: (message: string) => void;
}): ReclaimChaos {
  const { provisioner, probeDb, scopes, rng, onHarnessError } = input;
  const violations: Violation[] = [];
  const marks: ReclaimDeleteMark[] = [];
  const injected: string[] = [];
  let ownedChecked = 0;
  let deferredChecked = 0;

  /** Every scope owning the sandbox must be idle now: no active run, no raised fence. */
  const judgeOwners = async (sandboxId: string, generation: number | undefined, when: string) => {
    const harness = scopes.scopeOfSandbox(sandboxId);
    const { rows } = await probeDb.query<{
      uid: string;
      runtime_scope_id: string;
      active_run: string | null;
      fenced_run: string | null;
    }>(OWNERS_NOW, [sandboxId, harness?.uid ?? null, harness?.runtimeScopeId ?? null]);
    if (rows.length) ownedChecked += 1;
    for (const owner of rows) {
      if (owner.active_run === null && owner.fenced_run === null) continue;
      violations.push({
        invariant: Invariant.RECLAIM_NEVER_OWNED,
        key: `R:${sandboxId}#${generation}:${owner.uid}:${owner.runtime_scope_id}${when === 'arrival' ? '' : `:${when}`}`,
        message: `the reclaimer's DELETE ${sandboxId}?generation=${generation} ${when === 'arrival' ? 'reached the provisioner' : 'was carried out by the provisioner after it had answered'} while scope ${owner.runtime_scope_id} ${owner.active_run ? `had the active run ${owner.active_run}` : `had the fence of run ${owner.fenced_run} up`}`,
        details: { sandboxId, generation, when, ...owner },
      });
    }
  };

  provisioner.onRequest(async (info) => {
    if (info.method !== 'DELETE' || info.sandboxId === undefined) return;
    const sandboxId = info.sandboxId;
    // Taken on arrival, before the query: a DELETE answered while the query was still out ended
    // before a mark stamped afterwards, so the reclaimer's DELETE was counted as the protocol's
    // (the likely cause of the one R violation in the committed 2,000-run report).
    const arrivedAtMs = preciseNow();
    try {
      const inFlight = await probeDb.query(RECLAIM_IN_FLIGHT, [sandboxId]);
      if (inFlight.rowCount === 0) return;
      marks.push({ sandboxId, generation: info.generation, atMs: arrivedAtMs });
      await judgeOwners(sandboxId, info.generation, 'arrival');
    } catch (error) {
      onHarnessError(`reclaim probe: ${(error as Error).message}`);
    }
  });
  // The provisioner awaits this before it carries out a DELETE it answered earlier: the moment
  // the container goes, judged like the arrival (a run admitted meanwhile would lose it).
  provisioner.onDeferredDelete(async (info) => {
    if (info.sandboxId === undefined) return;
    const sandboxId = info.sandboxId;
    if (!marks.some((mark) => mark.sandboxId === sandboxId && mark.generation === info.generation)) return;
    try {
      deferredChecked += 1;
      await judgeOwners(sandboxId, info.generation, 'carried-out-later');
    } catch (error) {
      onHarnessError(`reclaim probe (delete carried out later): ${(error as Error).message}`);
    }
  });

  // Leak injection: a sandbox created and never recorded, at random moments.
  let stopped = false;
  const meanMs = input.meanLeakIntervalMs ?? 3_000;
  const inject = async () => {
    const sandboxId = `sbx-leaked-${randomUUID().slice(0, 12)}`;
    const response = await fetch(new URL('/api/sandboxes', provisioner.url), {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 'crashed-before-record', user_id: 'chaos' }),
    });
    await response.body?.cancel();
    if (response.ok) injected.push(sandboxId);
    else onHarnessError(`leak injection: POST answered ${response.status}`);
  };
  let timer: NodeJS.Timeout | undefined;
  let pending: Promise<void> = Promise.resolve();
  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(
      () => {
        pending = pending
          .then(inject)
          .catch((error: Error) => onHarnessError(`leak injection: ${error.message}`));
        schedule();
      },
      Math.round(meanMs * (0.5 + rng.next())),
    );
  };
  schedule();

  return {
    violations,
    isReclaimDelete: (request) =>
      request.sandboxId !== undefined &&
      marks.some(
        (mark) =>
          mark.sandboxId === request.sandboxId &&
          mark.generation === request.generation &&
          mark.atMs >= request.startedAt - 1 &&
          (request.endedAt === undefined || mark.atMs <= request.endedAt + 1),
      ),
    async settle(deadlineMs) {
      stopped = true;
      clearTimeout(timer);
      await pending;
      const live = () => injected.filter((id) => provisioner.sandbox(id) !== undefined);
      while (live().length > 0 && preciseNow() < deadlineMs) await new Promise((r) => setTimeout(r, 200));
      const stillLive = live();
      return {
        leaksInjected: injected.length,
        leaksReclaimed: injected.length - stillLive.length,
        leaksStillLive: stillLive,
        reclaimDeletes: marks.length,
        ownedChecked,
        carriedOutLaterChecked: deferredChecked,
        violations,
      };
    },
  };
}
