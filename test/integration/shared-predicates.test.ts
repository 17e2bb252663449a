/**
 * Issue 23: each protocol rule has one definition in SQL (infra/sql/), and every reader calls it.
 * Where the readers used to disagree, each now answers as the decisions do; these cases failed
 * with the old copies:
 *   - the reclaim scope hold counted a NULL status as finished (`status NOT IN (…)`);
 *   - the reclaimer's classification and force-clear read `released_at IS NOT NULL`, so a stale
 *     mark (one naming another generation, see runtime_cleanup_generation_released) made the live
 *     generation look released;
 *   - `ops explain` walked descendants only 32 deep and left NULL statuses out of "active".
 */
import { randomUUID } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { forceClear } from '../../functions/cleanup/force-clear.ts';
import { classifyListing } from '../../functions/cleanup/reclaim.ts';
import { readRunFacts } from '../../infra/ops/run-facts.ts';
import { NON_TERMINAL_RUN_STATUSES, TERMINAL_RUN_STATUSES } from '../../infra/run-statuses.ts';
import { finishedRootRun, insertOtherRun, type Scenario } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf } from '../support/probes.ts';

const fixture = useDatabaseFixture();

beforeAll(async () => {
  // A platform table whose NOT NULL was dropped again (migration 008 enforces it on adoption).
  await fixture.t.db.query('ALTER TABLE agent_runs ALTER COLUMN status DROP NOT NULL');
});

async function setStatusNull(runId: string): Promise<void> {
  await fixture.t.db.query('UPDATE agent_runs SET status = NULL WHERE id = $1::text', [runId]);
}

/** A release mark that names an older generation: what a write bypassing the 005 trigger leaves. */
async function staleReleaseMark(s: Scenario): Promise<void> {
  await fixture.t.db.query(
    `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation - 1
     WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [s.uid, s.runtimeScopeId],
  );
}

describe('the status predicates', () => {
  it('are the TypeScript lists, and count NULL and unknown statuses as active', async () => {
    const statuses = [
      ...TERMINAL_RUN_STATUSES,
      ...NON_TERMINAL_RUN_STATUSES,
      'queued',
      '',
      'COMPLETED',
      null,
    ];
    const { rows } = await fixture.t.db.query<{ status: string | null; terminal: boolean; active: boolean }>(
      `SELECT s AS status, runtime_cleanup_status_is_terminal(s) AS terminal, runtime_cleanup_status_is_active(s) AS active
       FROM unnest($1::text[]) WITH ORDINALITY AS u(s, n) ORDER BY n`,
      [statuses],
    );
    expect(rows).toEqual(
      statuses.map((status) => {
        const terminal = (TERMINAL_RUN_STATUSES as readonly (string | null)[]).includes(status);
        return { status, terminal, active: !terminal };
      }),
    );
  });
});

describe('the reclaimer asks the decisions’ rules', () => {
  it('a scope whose run has a NULL status holds its sandbox (scope_active), as every phase defers for it', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const queued = await insertOtherRun(fixture.t.db, s, { status: 'queued' });
    await setStatusNull(queued);

    const { rows } = await fixture.t.db.query<{ hold: string | null }>(
      'SELECT runtime_reclaim_scope_hold($1::text, $2::text, 0) AS hold',
      [s.uid, s.runtimeScopeId],
    );
    expect(rows[0]!.hold).toBe('scope_active');
  });

  it('a stale release mark does not make the listed generation released', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 4 });
    await staleReleaseMark(s);

    const {
      sandboxes: [classified],
    } = await classifyListing(fixture.t.db, [{ sandboxId: s.sandboxId, generation: 4, status: 'running' }], {
      graceSeconds: 0,
      provisioner: 'http://provisioner.test',
    });
    expect(classified!.owners).toEqual([expect.objectContaining({ generation: 4, released: false })]);
  });

  it('the reclaim guard runs as an autocommit statement under the default isolation (READ COMMITTED)', async () => {
    // Refused under REPEATABLE READ: test/integration/isolation.test.ts.
    const { rows } = await fixture.t.db.query<{ verdict: string }>(
      `SELECT verdict FROM runtime_cleanup_begin_reclaim($1::text, 1, true, 0, 60, 'token', 2000)`,
      [`sbx-${randomUUID()}`],
    );
    expect(rows[0]!.verdict).toBe('not_sighted');
  });
});

describe('force-clear asks the decisions’ rules', () => {
  it('names the live generation as left behind when a stale mark names another one', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 7 });
    await staleReleaseMark(s);

    const result = await forceClear(fixture.t.db, {
      runId: s.rootRunId,
      reason: 'stale mark',
      actor: 'oncall',
      dryRun: false,
    });
    expect(result.plan).toMatchObject({ sandboxId: s.sandboxId, generation: 7 });
    const { rows } = await fixture.t.db.query<{ sandbox_id: string | null; generation: string | null }>(
      'SELECT sandbox_id, generation::text FROM runtime_cleanup_overrides WHERE run_id = $1::text',
      [s.rootRunId],
    );
    expect(rows).toEqual([{ sandbox_id: s.sandboxId, generation: '7' }]);
  });

  it('is one decision call in one round trip, the dry run too', async () => {
    const db = await fixture.t.connect({ maxConnections: 1 });
    const s = await finishedRootRun(fixture.t.db);
    for (const dryRun of [true, false]) {
      const before = { ...db.stats };
      await forceClear(db, { runId: s.rootRunId, reason: 'one trip', actor: 'oncall', dryRun });
      expect([db.stats.queries - before.queries, db.stats.transactions - before.transactions]).toEqual([
        1, 1,
      ]);
    }
  });

  it('defers to a sibling whose status is NULL (SCOPE_ACTIVE)', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const queued = await insertOtherRun(fixture.t.db, s, { status: 'queued' });
    await setStatusNull(queued);

    const refusal = await rejectionOf(
      forceClear(fixture.t.db, { runId: s.rootRunId, reason: 'x', actor: 'oncall', dryRun: true }),
    );
    expect(refusal).toMatchObject({
      code: 'SCOPE_ACTIVE',
      details: expect.objectContaining({ activeRunId: queued }),
    });
  });
});

describe('ops explain shows what the decisions see', () => {
  it('lists a NULL-status sibling as active, and a descendant deeper than 32 levels; a cycle ends the walk', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const queued = await insertOtherRun(fixture.t.db, s, { status: 'queued' });
    await setStatusNull(queued);
    let parent = s.rootRunId;
    const chain: string[] = [];
    for (let depth = 1; depth <= 40; depth++) {
      parent = await insertOtherRun(fixture.t.db, s, {
        status: depth === 40 ? 'running' : 'completed',
        runType: 'subagent',
        runtimeScopeId: `${s.runtimeScopeId}-sub`,
        createdByRunId: parent,
      });
      chain.push(parent);
    }
    // A platform bug: the root names one of its descendants as its creator (a cycle).
    await fixture.t.db.query('UPDATE agent_runs SET created_by_run_id = $2::text WHERE id = $1::text', [
      s.rootRunId,
      chain[5],
    ]);

    const facts = await readRunFacts(fixture.t.db, s.rootRunId);
    expect(facts.scope.activeRuns.map((run) => run.runId)).toEqual([queued]);
    expect(facts.scope.activeDescendants.map((run) => run.runId)).toEqual([chain.at(-1)]);
    expect(facts.run.terminal).toBe(true);
  });
});
