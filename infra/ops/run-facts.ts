/**
 * What `explain <runId>` knows about one run's cleanup: read from the database without locks
 * (an operator's look must never queue behind a cleanup) and from the dead-letter queues by peeking.
 * Terminal, active, the descendant walk and released are the decisions' own SQL functions
 * (infra/sql/), so what an operator is shown is what the phases decide on.
 */
import type { Database } from '../../functions/adapters/database.ts';
import type { Queues } from '../../functions/adapters/queues.ts';
import { deadLetterQueueName } from '../../functions/adapters/queues.ts';
import { RunNotFoundError } from '../../functions/cleanup/errors.ts';
import { RunType } from '../../functions/cleanup/types.ts';
import { CONSUMED_QUEUES, type DeadLetter, peekDeadLetters } from './dead-letters.ts';
import { type ForcedClear, listForcedClears } from './forced-clears.ts';
import { isoTime } from './format.ts';

const RUN = `
  SELECT r.id, r.uid, r.runtime_scope_id, r.run_type, r.status, r.created_by_run_id,
         runtime_cleanup_status_is_terminal(r.status) AS terminal,
         r.runtime_cleanup_pending AS fence_pending, r.runtime_cleanup_pending_since AS pending_since,
         extract(epoch FROM now() - r.runtime_cleanup_pending_since)::float8 AS pending_seconds,
         r.runtime_cleanup_announced_at AS announced_at, r.worker_id, r.lease_expires_at,
         r.created_at, r.finished_at, c.workdir_path
  FROM agent_runs r
  LEFT JOIN conversations c
    ON c.id = r.conversation_id OR (r.conversation_id IS NULL AND c.thread_id = r.conversation_thread_id)
  WHERE r.id = $1::text
  LIMIT 1`;

const SCOPE = `
  SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked,
         s.sandbox_id, s.generation::text AS generation, s.released_at,
         runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                             s.sandbox_id, s.generation) AS released,
         s.delete_in_flight_until > now() AS delete_in_flight, s.delete_in_flight_until,
         s.delete_in_flight_run_id, s.delete_in_flight_sandbox_id,
         s.delete_in_flight_generation::text AS delete_in_flight_generation
  FROM (SELECT 1) AS one
  LEFT JOIN sandbox_runtimes s ON s.uid = $1::text AND s.runtime_scope_id = $2::text`;

/** The scope's other runs that matter to this cleanup: the active ones and the fenced roots. */
const SCOPE_RUNS = `
  SELECT id, run_type, status, runtime_cleanup_pending AS fence_pending,
         runtime_cleanup_status_is_active(status) AS active
  FROM agent_runs
  WHERE uid = $1::text AND runtime_scope_id = $2::text AND id <> $3::text
    AND (runtime_cleanup_status_is_active(status) OR (runtime_cleanup_pending AND run_type <> 'subagent'))
  ORDER BY created_at, id
  LIMIT 50`;

/** Active descendants, in any scope: phases 1 and 3 wait for them too (the same walk as theirs). */
const ACTIVE_DESCENDANTS = `
  SELECT id, status, run_type, runtime_scope_id FROM runtime_cleanup_descendants($1::text)
  WHERE runtime_cleanup_status_is_active(status)
  ORDER BY id
  LIMIT 50`;

interface RunRow {
  id: string;
  uid: string;
  runtime_scope_id: string;
  run_type: string;
  status: string;
  terminal: boolean;
  created_by_run_id: string | null;
  fence_pending: boolean;
  pending_since: Date | null;
  pending_seconds: number | null;
  announced_at: Date | null;
  worker_id: string | null;
  lease_expires_at: Date | null;
  created_at: Date;
  finished_at: Date | null;
  workdir_path: string | null;
}

export interface RunSummary {
  runId: string;
  runType: string;
  status: string;
}

export interface RunFacts {
  run: {
    runId: string;
    uid: string;
    runtimeScopeId: string;
    runType: string;
    status: string;
    /** runtime_cleanup_status_is_terminal(status): false for a NULL or unknown status. */
    terminal: boolean;
    createdByRunId: string | null;
    workdirPath: string | null;
    fencePending: boolean;
    pendingSince: string | null;
    pendingForSeconds: number | null;
    /** When the sweeper last announced this fence again. */
    lastAnnouncedAt: string | null;
    workerId: string | null;
    leaseExpiresAt: string | null;
    createdAt: string | null;
    finishedAt: string | null;
  };
  scope: {
    /** `runtime_cleanup_blocked(uid, scope)`: the platform admits no new run while true. */
    blocked: boolean;
    /** `released`: runtime_cleanup_generation_released, the decisions' rule (a stale releasedAt is not). */
    sandbox: { sandboxId: string; generation: number; releasedAt: string | null; released: boolean } | null;
    /**
     * A release's DELETE that may still act at the provisioner (the release guard's record): the
     * scope stays blocked and force-clear refuses until `until`, unless the release ends it first.
     */
    deleteInFlight: {
      until: string;
      runId: string | null;
      sandboxId: string | null;
      generation: number | null;
    } | null;
    /** Other non-terminal runs of the scope. */
    activeRuns: RunSummary[];
    /** Non-terminal runs created (transitively) by this run, in any scope. */
    activeDescendants: Array<RunSummary & { runtimeScopeId: string }>;
    /** Other root runs of the scope whose fence is up (each blocks the scope too). */
    otherFences: string[];
  };
  forcedClears: ForcedClear[];
  deadLetters: DeadLetter[];
  /** False when a peek hit its cap, null when the queues could not be read. */
  deadLettersComplete: boolean | null;
  /** Why the dead-letter listing may lack letters (per DLQ), or null when it is complete. */
  deadLettersIncomplete: string | null;
  deadLettersError: string | null;
}

export async function readRunFacts(
  db: Pick<Database, 'query' | 'transact'>,
  runId: string,
): Promise<Pick<RunFacts, 'run' | 'scope' | 'forcedClears'>> {
  // Reads only: each is safe to send again after a lost connection (Database.query does, once).
  const { rows } = await db.query<RunRow>(RUN, [runId]);
  const run = rows[0];
  if (!run) throw new RunNotFoundError(runId);
  const [scope, scopeRuns, descendants, forcedClears] = await Promise.all([
    // runtime_cleanup_blocked answers only at READ COMMITTED (it raises otherwise, so that a
    // platform on a database defaulting to REPEATABLE READ fails loudly): one READ COMMITTED trip.
    db.transact<{
      blocked: boolean;
      sandbox_id: string | null;
      generation: string | null;
      released_at: Date | null;
      released: boolean | null;
      delete_in_flight: boolean | null;
      delete_in_flight_until: Date | null;
      delete_in_flight_run_id: string | null;
      delete_in_flight_sandbox_id: string | null;
      delete_in_flight_generation: string | null;
    }>(SCOPE, [run.uid, run.runtime_scope_id]),
    db.query<{ id: string; run_type: string; status: string; fence_pending: boolean; active: boolean }>(
      SCOPE_RUNS,
      [run.uid, run.runtime_scope_id, run.id],
    ),
    db.query<{ id: string; status: string; run_type: string; runtime_scope_id: string }>(ACTIVE_DESCENDANTS, [
      run.id,
    ]),
    listForcedClears(db, { runId, limit: 20 }),
  ]);
  const sandboxRow = scope.rows[0]!;
  return {
    run: {
      runId: run.id,
      uid: run.uid,
      runtimeScopeId: run.runtime_scope_id,
      runType: run.run_type,
      status: run.status,
      terminal: run.terminal,
      createdByRunId: run.created_by_run_id,
      workdirPath: run.workdir_path,
      fencePending: run.fence_pending,
      pendingSince: isoTime(run.pending_since),
      pendingForSeconds: run.pending_seconds === null ? null : Math.round(run.pending_seconds),
      lastAnnouncedAt: isoTime(run.announced_at),
      workerId: run.worker_id,
      leaseExpiresAt: isoTime(run.lease_expires_at),
      createdAt: isoTime(run.created_at),
      finishedAt: isoTime(run.finished_at),
    },
    scope: {
      blocked: sandboxRow.blocked,
      sandbox:
        sandboxRow.sandbox_id !== null && sandboxRow.generation !== null
          ? {
              sandboxId: sandboxRow.sandbox_id,
              generation: Number(sandboxRow.generation),
              releasedAt: isoTime(sandboxRow.released_at),
              released: sandboxRow.released === true,
            }
          : null,
      deleteInFlight: sandboxRow.delete_in_flight
        ? {
            until: isoTime(sandboxRow.delete_in_flight_until)!,
            runId: sandboxRow.delete_in_flight_run_id,
            sandboxId: sandboxRow.delete_in_flight_sandbox_id,
            generation:
              sandboxRow.delete_in_flight_generation === null
                ? null
                : Number(sandboxRow.delete_in_flight_generation),
          }
        : null,
      activeRuns: scopeRuns.rows
        .filter((row) => row.active)
        .map((row) => ({ runId: row.id, runType: row.run_type, status: row.status })),
      activeDescendants: descendants.rows.map((row) => ({
        runId: row.id,
        runType: row.run_type,
        status: row.status,
        runtimeScopeId: row.runtime_scope_id,
      })),
      otherFences: scopeRuns.rows
        .filter((row) => row.fence_pending && row.run_type !== RunType.SUBAGENT)
        .map((row) => row.id),
    },
    forcedClears,
  };
}

/** The dead letters whose body names this run, oldest first. */
export async function readDeadLettersOf(
  queues: Queues,
  runId: string,
): Promise<Pick<RunFacts, 'deadLetters' | 'deadLettersComplete' | 'deadLettersIncomplete'>> {
  const peeks = await Promise.all(CONSUMED_QUEUES.map((queue) => peekDeadLetters(queues, queue)));
  return {
    deadLetters: peeks
      .flatMap((peek) => peek.letters.filter((letter) => letter.runId === runId))
      .sort((a, b) => (a.deadLetteredAt ?? '').localeCompare(b.deadLetteredAt ?? '')),
    deadLettersComplete: peeks.every((peek) => peek.complete),
    deadLettersIncomplete:
      peeks
        .map((peek, index) =>
          peek.incompleteBecause
            ? `${deadLetterQueueName(CONSUMED_QUEUES[index]!)}: ${peek.incompleteBecause}`
            : '',
        )
        .filter(Boolean)
        .join('; ') || null,
  };
}
