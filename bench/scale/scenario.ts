/**
 * Part 3: fences at scale (issue 11.6, issue 15). A generated dataset — `runs` agent runs, of which
 * `fences` carry a root fence, spread over many scopes, most of them terminal, with a sandbox row
 * per scope — and the statements that must stay index lookups however large it grows:
 *
 * - `runtime_cleanup_blocked(uid, scope)`, called by the platform on every admission;
 * - the sweeper's claim of due fences (CLAIM_DUE_FENCES, rolled back after each sample so every
 *   sample claims the same backlog);
 * - `ops fences` (PENDING_FENCES, oldest first, and its count).
 *
 * Each is timed from the client (through the same driver and bridge as everything else; p50/p99
 * over `samples` calls on random scopes) and its plan recorded with EXPLAIN (ANALYZE, BUFFERS).
 */
import { CLAIM_DUE_FENCES } from '../../functions/sweeper/sweep.ts';
import { COUNT_PENDING_FENCES, PENDING_FENCES } from '../../infra/ops/commands/fences.ts';
import type { BenchPostgres } from '../support/postgres.ts';
import { type Summary, summarize } from '../support/stats.ts';

export interface ScaleProfile {
  runs: number;
  fences: number;
  samples: number;
}

export interface ScaleStatement {
  name: string;
  sql: string;
  latencyMs: Summary;
  plan: string;
}

export interface ScaleReport {
  profile: ScaleProfile;
  generateSeconds: number;
  statements: ScaleStatement[];
}

/** Scopes: one per 20 runs; users: one per 10 scopes. Every `runs / fences`-th run is fenced. */
const GENERATE_RUNS = `
  INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, run_type, status,
                          runtime_cleanup_pending, finished_at)
  SELECT 'scale-' || g, 'scale-user-' || (g % ($1::int / 200)), NULL, 'thread-scale', 'scale-scope-' || (g % ($1::int / 20)),
         CASE WHEN g % 97 = 0 THEN 'subagent' ELSE 'chat' END,
         CASE WHEN g % 50 = 0 THEN 'running' ELSE 'completed' END,
         g % ($1::int / $2::int) = 0 AND g % 97 <> 0,
         now() - make_interval(secs => g % 7200)
  FROM generate_series(1, $1::int) AS g`;
/** Fences raised over the last two hours; most announced a minute ago (an outage's backlog). */
const AGE_FENCES = `
  UPDATE agent_runs SET runtime_cleanup_pending_since = finished_at,
         runtime_cleanup_announced_at = CASE WHEN random() < 0.9 THEN now() - interval '1 minute' END
  WHERE runtime_cleanup_pending`;
const GENERATE_SANDBOXES = `
  INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
  SELECT 'scale-user-' || (g % ($1::int / 200)), 'scale-scope-' || g, 'sbx-scale-' || g, 1
  FROM generate_series(0, $1::int / 20 - 1) AS g`;

const BLOCKED = 'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked';
/**
 * The function's body (migration 004), explained in its place: a SQL function with sub-selects is
 * not inlined, so EXPLAIN of the call shows only "Result".
 */
const BLOCKED_BODY = `
  SELECT EXISTS (
    SELECT 1 FROM agent_runs r
    WHERE r.uid = $1::text AND r.runtime_scope_id = $2::text AND r.run_type <> 'subagent' AND r.runtime_cleanup_pending
  ) OR EXISTS (
    SELECT 1 FROM sandbox_runtimes s
    WHERE s.uid = $1::text AND s.runtime_scope_id = $2::text AND s.delete_in_flight_until > now()
  )`;
const SWEEP_AFTER_SECONDS = 300;
const SWEEP_LIMIT = 100;
const FENCES_LIMIT = 50;

class RolledBack extends Error {}

export async function runScaleScenario(
  postgres: BenchPostgres,
  profile: ScaleProfile,
  log: (line: string) => void,
): Promise<ScaleReport> {
  const database = await postgres.createDatabase('scale');
  try {
    const db = await database.open({ maxConnections: 2 });
    const generating = performance.now();
    await db.queryOnce(GENERATE_RUNS, [profile.runs, profile.fences]);
    await db.queryOnce(AGE_FENCES);
    await db.queryOnce(GENERATE_SANDBOXES, [profile.runs]);
    await db.query('ANALYZE agent_runs');
    await db.query('ANALYZE sandbox_runtimes');
    const generateSeconds = Math.round((performance.now() - generating) / 100) / 10;
    const { rows: counted } = await db.query<{ runs: number; fences: number }>(
      `SELECT count(*)::int AS runs, (SELECT count(*)::int FROM agent_runs WHERE runtime_cleanup_pending AND run_type <> 'subagent') AS fences FROM agent_runs`,
    );
    log(
      `  scale: ${counted[0]!.runs} runs, ${counted[0]!.fences} pending root fences generated in ${generateSeconds} s`,
    );

    const scopeCount = Math.floor(profile.runs / 20);
    const userCount = Math.floor(profile.runs / 200);
    const randomScope = () => {
      const g = Math.floor(Math.random() * scopeCount);
      return [`scale-user-${g % userCount}`, `scale-scope-${g}`];
    };
    const time = async (work: () => Promise<unknown>) => {
      const started = performance.now();
      await work();
      return performance.now() - started;
    };
    const timedSamples = async (count: number, work: () => Promise<unknown>) => {
      const samples: number[] = [];
      for (let i = 0; i < count; i += 1) samples.push(await time(work));
      return summarize(samples);
    };
    const explain = async (sql: string, values: unknown[], rollBack = false) => {
      let plan = '';
      await db
        .withTransaction(async (tx) => {
          const { rows } = await tx.query<{ 'QUERY PLAN': string }>(
            `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ${sql}`,
            values,
          );
          plan = rows.map((row) => row['QUERY PLAN']).join('\n');
          if (rollBack) throw new RolledBack();
        })
        .catch((error: unknown) => {
          if (!(error instanceof RolledBack)) throw error;
        });
      return plan;
    };

    const statements: ScaleStatement[] = [];
    const blockedScope = randomScope();
    statements.push({
      name: 'runtime_cleanup_blocked (admission)',
      sql: BLOCKED,
      latencyMs: await timedSamples(profile.samples, () => db.query(BLOCKED, randomScope())),
      plan: await explain(BLOCKED_BODY, blockedScope),
    });
    const claimOnce = () =>
      db
        .withTransaction(async (tx) => {
          await tx.query(CLAIM_DUE_FENCES, [SWEEP_AFTER_SECONDS, SWEEP_LIMIT]);
          throw new RolledBack();
        })
        .catch((error: unknown) => {
          if (!(error instanceof RolledBack)) throw error;
        });
    statements.push({
      name: `sweeper claim (due fences, limit ${SWEEP_LIMIT}; rolled back)`,
      sql: CLAIM_DUE_FENCES,
      latencyMs: await timedSamples(Math.max(10, Math.floor(profile.samples / 10)), claimOnce),
      plan: await explain(CLAIM_DUE_FENCES, [SWEEP_AFTER_SECONDS, SWEEP_LIMIT], true),
    });
    statements.push({
      name: `ops fences (oldest ${FENCES_LIMIT})`,
      sql: PENDING_FENCES,
      latencyMs: await timedSamples(Math.max(10, Math.floor(profile.samples / 10)), () =>
        db.query(PENDING_FENCES, [FENCES_LIMIT]),
      ),
      plan: await explain(PENDING_FENCES, [FENCES_LIMIT]),
    });
    statements.push({
      name: 'ops fences (count)',
      sql: COUNT_PENDING_FENCES,
      latencyMs: await timedSamples(Math.max(10, Math.floor(profile.samples / 10)), () =>
        db.query(COUNT_PENDING_FENCES),
      ),
      plan: await explain(COUNT_PENDING_FENCES, []),
    });
    for (const statement of statements) {
      log(`  scale: ${statement.name}: p50 ${statement.latencyMs.p50} ms, p99 ${statement.latencyMs.p99} ms`);
    }
    return { profile, generateSeconds, statements };
  } finally {
    await database.drop();
  }
}
