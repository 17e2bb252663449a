import { loadConfig } from '../../functions/adapters/config.ts';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { DatabaseUnavailableError } from '../../functions/adapters/errors.ts';
import { isCleanupError } from '../../functions/cleanup/errors.ts';
import { closeLocalBridge } from '../../infra/local/database.ts';

/**
 * The victim of the termination-storm test, run as a CHILD PROCESS so that a crash (an 'error'
 * event nobody listens to, an unhandled rejection) shows up as the process dying, exactly as it
 * would take a Lambda instance down with its whole batch. It installs no 'uncaughtException' or
 * 'unhandledRejection' handler on purpose: Node's defaults must stay lethal.
 *
 * STORM_WORKERS workers loop over cleanup-shaped work for STORM_DURATION_MS on their own scopes
 * (no contention, so no lock timeouts): a short transaction (the scope's advisory lock, the run's
 * row lock, a pause in which the client sits idle in the transaction, an update, commit) and the
 * plain reads of the release guard and the sweeper. STORM_FRESH_WORKERS of them open a new
 * database handle for every operation, so connects happen all the time and the storm meets them.
 * Meanwhile the parent terminates this process's backends (application_name) at random moments.
 *
 * Prints one JSON line: counts per outcome, and every failure that was not a
 * DatabaseUnavailableError (there must be none). Exit 0 unless such a failure occurred.
 */
interface Summary {
  operations: number;
  succeeded: number;
  unavailable: number;
  unexpected: string[];
  retries: number;
}

const env = process.env;
const url = required('STORM_DATABASE_URL');
/** The driver under the storm (DATABASE_DRIVER's values), and the bridge the `neon` one goes through. */
const driver = loadConfig({ DATABASE_DRIVER: required('STORM_DRIVER') }).databaseDriver;
const wsProxy = required('STORM_WS_PROXY');
const workers = Number(env.STORM_WORKERS ?? '30');
const freshWorkers = Number(env.STORM_FRESH_WORKERS ?? '6');
const durationMs = Number(env.STORM_DURATION_MS ?? '5000');
/**
 * Work on past the duration (under the storm: the parent stops it when this process ends) until
 * this many operations succeeded, up to STORM_MAX_MS in all: on a machine busy with the rest
 * of a test suite, 6 s of 30 workers once made only 82, and the test needs enough work for the
 * storm to meet.
 */
const minSucceeded = Number(env.STORM_MIN_SUCCEEDED ?? '0');
/** The hard end of the work, whatever else holds (default: the duration and four more). */
const maxMs = Number(env.STORM_MAX_MS ?? String(5 * durationMs));
/** A pause between one worker's operations (the chaos suite's long-lived storm process is frugal). */
const pauseMs = Number(env.STORM_PAUSE_MS ?? '0');
/**
 * SIGTERM ends the work early (once STORM_MIN_SUCCEEDED operations succeeded) and still prints the
 * summary: the chaos suite stops its storm process that way, and the survival test once the storm
 * met every moment of a connection's life. No handler for errors is installed, so a crash stays a
 * crash.
 */
let stopping = false;
process.once('SIGTERM', () => {
  stopping = true;
});
const timeouts = {
  lockTimeoutMs: 5_000,
  statementTimeoutMs: 15_000,
  connectTimeoutMs: 5_000,
  queryTimeoutMs: 20_000,
};

function required(name: string): string {
  const value = env[name];
  if (!value) throw new Error(`${name} is required`);
  return value;
}

const LOCK_SCOPE = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';
const LOCK_RUN = 'SELECT id, status FROM agent_runs WHERE id = $1::text FOR UPDATE';
const TOUCH_RUN = 'UPDATE agent_runs SET updated_at = now() WHERE id = $1::text';
const GUARD_READ = `
  SELECT r.runtime_cleanup_pending AS fence_current,
         (SELECT a.id FROM agent_runs a
           WHERE a.uid = r.uid AND a.runtime_scope_id = r.runtime_scope_id AND a.id <> r.id
             AND runtime_cleanup_status_is_active(a.status) LIMIT 1) AS active_run_id
  FROM agent_runs r WHERE r.id = $1::text`;
const SWEEP_STATS = `
  SELECT count(*)::int AS pending FROM agent_runs WHERE runtime_cleanup_pending AND run_type <> 'subagent'`;

const summary: Summary = {
  operations: 0,
  succeeded: 0,
  unavailable: 0,
  unexpected: [],
  retries: 0,
};

function record(error: unknown): void {
  if (error instanceof DatabaseUnavailableError) {
    summary.unavailable += 1;
    return;
  }
  const description = isCleanupError(error)
    ? `${error.code}: ${error.message}`
    : error instanceof Error
      ? `${error.name}: ${error.message}`
      : String(error);
  if (summary.unexpected.length < 20) summary.unexpected.push(description);
  else summary.unexpected[19] = `… and more (${description})`;
}

async function cleanupTransaction(db: Database, scope: Scope): Promise<void> {
  await db.withTransaction(async (tx) => {
    await tx.query(LOCK_SCOPE, [scope.uid, scope.scopeId]);
    await tx.query(LOCK_RUN, [scope.runId]);
    // The client sits idle in its transaction here, as between a phase's statements.
    await new Promise((resolve) => setTimeout(resolve, Math.random() * 3));
    await tx.query(TOUCH_RUN, [scope.runId]);
  });
}

async function operation(db: Database, scope: Scope, turn: number): Promise<void> {
  if (turn % 3 === 0) await cleanupTransaction(db, scope);
  else if (turn % 3 === 1) await db.query(GUARD_READ, [scope.runId]);
  else await db.query(SWEEP_STATS);
}

interface Scope {
  uid: string;
  scopeId: string;
  runId: string;
}

async function seed(db: Database): Promise<Scope[]> {
  const scopes: Scope[] = [];
  for (let index = 0; index < workers; index += 1) {
    const uid = `storm-user-${process.pid}-${index}`;
    const scopeId = `storm-scope-${index}`;
    const runId = `storm-run-${process.pid}-${index}`;
    const { rows } = await db.queryOnce<{ id: string }>(
      'INSERT INTO conversations (uid, thread_id, workdir_path) VALUES ($1::text, $2::text, $3::text) RETURNING id',
      [uid, `storm-thread-${process.pid}-${index}`, `projects/storm-${index}`],
    );
    await db.queryOnce(
      `INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, status)
       VALUES ($1::text, $2::text, $3::bigint, $4::text, $5::text, 'completed')`,
      [runId, uid, rows[0]!.id, `storm-thread-${process.pid}-${index}`, scopeId],
    );
    scopes.push({ uid, scopeId, runId });
  }
  return scopes;
}

async function main(): Promise<void> {
  // The seed goes through a handle of its own that the storm does not target.
  const seeder = await openDatabase({
    url: required('STORM_SEED_URL'),
    driver,
    wsProxy,
    maxConnections: 1,
    ...timeouts,
  });
  const scopes = await seed(seeder);
  await seeder.end();

  const shared = await openDatabase({ url, driver, wsProxy, maxConnections: workers + 2, ...timeouts });
  const started = performance.now();
  const until = started + durationMs;
  const cap = started + maxMs;
  const goOn = () => {
    const now = performance.now();
    const enough = summary.succeeded >= minSucceeded;
    return now < cap && !(stopping && enough) && (now < until || !enough);
  };
  // Tells the parent to start the storm: every worker is about to run.
  console.log(JSON.stringify({ ready: true }));
  await Promise.all(
    scopes.map(async (scope, index) => {
      const fresh = index < freshWorkers;
      for (let turn = 0; goOn(); turn += 1) {
        if (pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, Math.random() * pauseMs));
        summary.operations += 1;
        let db: Database | undefined;
        try {
          db = fresh ? await openDatabase({ url, driver, wsProxy, maxConnections: 1, ...timeouts }) : shared;
          await operation(db, scope, turn);
          summary.succeeded += 1;
        } catch (error) {
          record(error);
        } finally {
          if (fresh && db) {
            summary.retries += db.stats.reconnects;
            await db.end().catch(record);
          }
        }
      }
    }),
  );
  summary.retries += shared.stats.reconnects;
  await shared.end().catch(record);
  await closeLocalBridge();
  console.log(JSON.stringify(summary));
  process.exitCode = summary.unexpected.length ? 1 : 0;
}

await main();
