import { ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import { Client } from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import { QueueName } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { CLAIM_DUE_FENCES, FENCE_STATS, sweepFences } from '../../functions/sweeper/sweep.ts';
import { COUNT_PENDING_FENCES, listPendingFences, PENDING_FENCES } from '../../infra/ops/commands/fences.ts';
import { finishedRootRun } from '../support/factories.ts';
import { useDatabaseFixture, useSqsFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';

/**
 * Admission and the sweeper at scale (issue 11, item 6), on a generated dataset large enough that
 * the planner would walk every pending fence without the indexes of migration 006 (each negative
 * control drops the index in a rolled-back transaction and shows exactly that). Plans are read as
 * the statements are really run: the SQL functions' inner statements through auto_explain (their
 * parameters bound as a call binds them, custom and generic plans both), the others with EXPLAIN on
 * the values the code passes.
 *
 * And a fence whose `runtime_cleanup_pending_since` is NULL (a write that bypassed the trigger) is
 * seen by the sweeper's claim, its backlog figures (PendingFences, OldestFenceAge: the
 * oldest-fence alarm's metric) and `ops fences`, and is cleaned up like any other.
 */
const fixture = useDatabaseFixture();
const sqsFixture = useSqsFixture();

const RUNS = 100_000;
/** 10 % of the runs carry a fence (2 % of those are subagents', which block nothing). */
const GENERATE_RUNS = `
  INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, run_type, status,
                          runtime_cleanup_pending, finished_at)
  SELECT 'bulk-' || g, 'bulk-user-' || (g % 5000), NULL, 'thread-bulk', 'bulk-scope-' || (g % 20000),
         CASE WHEN g % 50 = 1 THEN 'subagent' ELSE 'chat' END,
         CASE WHEN g % 25 = 0 THEN 'running' ELSE 'completed' END,
         g % 10 = 1,
         now() - make_interval(secs => g % 7200)
  FROM generate_series(1, $1::int) AS g`;
/** Fences raised over the last two hours; most were announced a minute ago (an outage's backlog). */
const AGE_FENCES = `
  UPDATE agent_runs SET runtime_cleanup_pending_since = finished_at,
         runtime_cleanup_announced_at = CASE WHEN random() < 0.9 THEN now() - interval '1 minute' END
  WHERE id LIKE 'bulk-%' AND runtime_cleanup_pending`;
const GENERATE_SANDBOXES = `
  INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
  SELECT 'bulk-user-' || (g % 5000), 'bulk-scope-' || g, 'sbx-bulk-' || g, 1 FROM generate_series(0, 19999) AS g`;

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Index Cond'?: string;
  Filter?: string;
  Plans?: PlanNode[];
}

function nodesOf(plan: PlanNode): PlanNode[] {
  return [plan, ...(plan.Plans ?? []).flatMap(nodesOf)];
}

/** The scans of agent_runs in a plan. */
function runScans(plan: PlanNode): PlanNode[] {
  return nodesOf(plan).filter((node) => node['Relation Name'] === 'agent_runs');
}

/**
 * A session that shows the plan of every statement, nested ones included: a raw node-postgres
 * client over TCP, whichever driver the run's pools use (the plans are the server's, not the
 * driver's; Neon's Client worked only where an earlier pool had pointed Neon's global settings at
 * the bridge).
 */
async function explainingSession(): Promise<{
  client: Client;
  plansOf(sql: string, values?: unknown[]): Promise<Array<{ query: string; plan: PlanNode }>>;
  close(): Promise<void>;
}> {
  const client = new Client({ connectionString: fixture.t.url });
  await client.connect();
  const notices: string[] = [];
  client.on('notice', (notice: { message?: string }) => notices.push(notice.message ?? ''));
  await client.query(`LOAD 'auto_explain'`);
  for (const setting of [
    'auto_explain.log_min_duration = 0',
    'auto_explain.log_nested_statements = on',
    'auto_explain.log_format = json',
    'auto_explain.log_level = notice',
  ]) {
    await client.query(`SET ${setting}`);
  }
  return {
    client,
    async plansOf(sql, values = []) {
      notices.length = 0;
      await client.query(sql, values);
      return notices
        .map((text) => text.slice(text.indexOf('{')))
        .map((json) => JSON.parse(json) as { 'Query Text': string; Plan: PlanNode })
        .map((entry) => ({ query: entry['Query Text'], plan: entry.Plan }));
    },
    close: () => client.end(),
  };
}

async function explain(sql: string, values: unknown[]): Promise<PlanNode> {
  const { rows } = await fixture.t.db.query<{ 'QUERY PLAN': Array<{ Plan: PlanNode }> }>(
    `EXPLAIN (FORMAT JSON) ${sql}`,
    values,
  );
  return rows[0]!['QUERY PLAN'][0]!.Plan;
}

/** EXPLAINs `sql` once more in a transaction where `index` does not exist, then rolls back. */
async function explainWithout(index: string, sql: string, values: unknown[]): Promise<PlanNode> {
  let plan: PlanNode | undefined;
  await fixture.t.db
    .withTransaction(async (tx) => {
      // The index name comes from this file's constants, never from input.
      await tx.query(`DROP INDEX ${index}`);
      const { rows } = await tx.query<{ 'QUERY PLAN': Array<{ Plan: PlanNode }> }>(
        `EXPLAIN (FORMAT JSON) ${sql}`,
        values,
      );
      plan = rows[0]!['QUERY PLAN'][0]!.Plan;
      throw new Error('roll back');
    })
    .catch((error: Error) => {
      if (error.message !== 'roll back') throw error;
    });
  return plan!;
}

beforeAll(async () => {
  await fixture.t.db.query(GENERATE_RUNS, [RUNS]);
  await fixture.t.db.query(AGE_FENCES);
  await fixture.t.db.query(GENERATE_SANDBOXES);
  await fixture.t.db.query('ANALYZE agent_runs');
  await fixture.t.db.query('ANALYZE sandbox_runtimes');
}, 120_000);

describe('admission: runtime_cleanup_blocked is an index lookup whatever the backlog', () => {
  const CALL = 'SELECT runtime_cleanup_blocked($1::text, $2::text)';
  const SCOPE = ['bulk-user-1', 'bulk-scope-1'];

  it.each(['auto', 'force_generic_plan'])(
    'looks the scope up by index (plan_cache_mode %s)',
    async (mode) => {
      const session = await explainingSession();
      try {
        await session.client.query(`SET plan_cache_mode = ${mode}`);
        // A few calls: a cached plan may switch from custom to generic after the fifth.
        let body: PlanNode | undefined;
        for (let call = 0; call < 7; call += 1) {
          const plans = await session.plansOf(CALL, SCOPE);
          body = plans.find((entry) => entry.query.includes('FROM agent_runs r'))?.plan;
        }
        const [scan] = runScans(body!);
        expect(scan).toMatchObject({
          'Index Name': 'agent_runs_fences_by_scope',
          'Index Cond': expect.stringMatching(/uid = .*runtime_scope_id = /),
        });
        const sandboxScan = nodesOf(body!).find((node) => node['Relation Name'] === 'sandbox_runtimes');
        expect(sandboxScan).toMatchObject({ 'Index Name': 'sandbox_runtimes_pkey' });
      } finally {
        await session.close();
      }
    },
  );

  it('would walk every pending fence without agent_runs_fences_by_scope (negative control)', async () => {
    const session = await explainingSession();
    try {
      await session.client.query('BEGIN');
      await session.client.query('DROP INDEX agent_runs_fences_by_scope');
      // The reclaimer's index of all runs by scope (migration 009) would bound the walk to one
      // scope's runs; the control is about having no scope index at all.
      await session.client.query('DROP INDEX agent_runs_by_scope');
      const plans = await session.plansOf(CALL, SCOPE);
      await session.client.query('ROLLBACK');
      const body = plans.find((entry) => entry.query.includes('FROM agent_runs r'))!.plan;
      const [scan] = runScans(body);
      expect(scan!['Index Cond'] ?? '').not.toMatch(/uid/);
      expect(scan!.Filter ?? '').toMatch(/uid/);
    } finally {
      await session.close();
    }
  });
});

describe('the release guard reads by index only', () => {
  it.each(['auto', 'force_generic_plan'])(
    'scans no table in any statement (plan_cache_mode %s)',
    async (mode) => {
      const s = await finishedRootRun(fixture.t.db);
      const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
      const session = await explainingSession();
      try {
        await session.client.query(`SET plan_cache_mode = ${mode}`);
        const call = `SELECT * FROM runtime_cleanup_begin_release($1::text, $2::text, $3::text, $4::text, $5::bigint,
                                                               $6::text, 60, 'plan-test', 1000)`;
        const values = [s.rootRunId, s.uid, s.runtimeScopeId, s.sandboxId, s.generation, identity.fenceSetAt];
        let plans: Array<{ query: string; plan: PlanNode }> = [];
        for (let attempt = 0; attempt < 7; attempt += 1) {
          plans = await session.plansOf(call, values);
          await session.client.query(
            `UPDATE sandbox_runtimes SET delete_in_flight_until = NULL, delete_in_flight_token = NULL
           WHERE uid = $1::text AND runtime_scope_id = $2::text`,
            [s.uid, s.runtimeScopeId],
          );
        }
        const scans = plans.flatMap((entry) => nodesOf(entry.plan)).filter((node) => node['Relation Name']);
        expect(scans.length).toBeGreaterThanOrEqual(4);
        expect(scans.filter((node) => node['Node Type'] === 'Seq Scan')).toEqual([]);
      } finally {
        await session.close();
      }
    },
  );
});

describe('the sweeper and ops fences read by index', () => {
  it('claims exactly the due fences by a range scan of agent_runs_fences_due', async () => {
    const plan = await explain(CLAIM_DUE_FENCES, [600, 200]);
    const [scan] = runScans(plan).filter((node) => node['Node Type'] !== 'ModifyTable' && node['Index Cond']);
    expect(scan).toMatchObject({
      'Index Name': 'agent_runs_fences_due',
      'Index Cond': expect.stringMatching(/GREATEST/i),
    });
    // Negative control: without it, the due condition is a filter over every pending fence.
    const without = runScans(await explainWithout('agent_runs_fences_due', CLAIM_DUE_FENCES, [600, 200]));
    expect(without.some((node) => /GREATEST/i.test(node['Index Cond'] ?? ''))).toBe(false);
    expect(without.some((node) => /GREATEST/i.test(node.Filter ?? ''))).toBe(true);
  });

  it('lists the oldest fences and counts them without reading a table row by sequential scan', async () => {
    for (const [sql, values] of [
      [PENDING_FENCES, [50]],
      [COUNT_PENDING_FENCES, []],
      [FENCE_STATS, []],
    ] as const) {
      const plan = await explain(sql, [...values]);
      const scans = runScans(plan);
      expect(scans.length).toBeGreaterThan(0);
      for (const scan of scans) expect(scan['Node Type']).not.toBe('Seq Scan');
    }
    const list = runScans(await explain(PENDING_FENCES, [50]));
    expect(list[0]).toMatchObject({ 'Index Name': 'agent_runs_fences_by_age' });
  });
});

describe('a fence whose raise time is NULL (written by a path that bypassed the trigger)', () => {
  /** What a platform writing with `session_replication_role = replica` (triggers off) leaves. */
  async function fenceBypassingTrigger(finishedSecondsAgo: number) {
    const s = await finishedRootRun(fixture.t.db, { status: 'running' });
    await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
      s.rootRunId,
    ]);
    await fixture.t.db.withTransaction(async (tx) => {
      await tx.query(`SET LOCAL session_replication_role = replica`);
      await tx.query(
        `UPDATE agent_runs SET status = 'completed', runtime_cleanup_pending = true,
                finished_at = now() - make_interval(secs => $2::int)
         WHERE id = $1::text`,
        [s.rootRunId, finishedSecondsAgo],
      );
    });
    const { rows } = await fixture.t.db.query<{ since: Date | null; pending: boolean }>(
      'SELECT runtime_cleanup_pending_since AS since, runtime_cleanup_pending AS pending FROM agent_runs WHERE id = $1::text',
      [s.rootRunId],
    );
    expect(rows[0]).toEqual({ since: null, pending: true });
    return s;
  }

  it('is claimed and announced by the sweeper, aged from when its run finished, and counted', async () => {
    const s = await fenceBypassingTrigger(3 * 86_400);

    const result = await sweepFences(
      { db: fixture.t.db, queues: sqsFixture.queues },
      { sweepAfterSeconds: 86_400, limit: 10_000 },
    );

    expect(result.announced).toContain(s.rootRunId);
    expect(result.oldestFenceAgeSeconds).toBeGreaterThanOrEqual(3 * 86_400);
    // Every generated root fence (a tenth of the runs, less the subagents' fiftieth) and this one.
    expect(result.pendingFences).toBeGreaterThanOrEqual(RUNS / 10 - RUNS / 50 + 1);
    const url = await sqsFixture.queues.url(QueueName.RUN_FINISHED);
    const bodies: string[] = [];
    for (let i = 0; i < 20 && !bodies.some((body) => body.includes(s.rootRunId)); i += 1) {
      const { Messages = [] } = await sqsFixture.sqs.send(
        new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1 }),
      );
      bodies.push(...Messages.map((message) => message.Body ?? ''));
    }
    expect(bodies.some((body) => JSON.parse(body).runId === s.rootRunId)).toBe(true);
  });

  it('is listed first by ops fences, with its estimated age', async () => {
    const s = await fenceBypassingTrigger(30 * 86_400);
    const { fences } = await listPendingFences(fixture.t.db, 5);
    expect(fences[0]).toMatchObject({ runId: s.rootRunId, pendingSince: null });
    expect(fences[0]!.ageSeconds).toBeGreaterThanOrEqual(30 * 86_400);
  });

  it('is cleaned up through the guard and finalize: phases 1 and 3 compare its NULL identity', async () => {
    const s = await fenceBypassingTrigger(60);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    expect(identity.fenceSetAt).toBeNull();
    const guard = await beginRelease(
      fixture.t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      { inFlightSeconds: 60, lockTimeoutMs: 1_000 },
    );
    if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(guard.verdict);
    await endRelease(fixture.t.db, guard.inFlight);
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
  });
});
