import { readFile } from 'node:fs/promises';
import { beforeAll, describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { DeferralReason, FenceCheckOutcome, FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { finishedRootRun, insertOtherRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf, releaseNeeded } from '../support/probes.ts';

/**
 * A platform-made `agent_runs` adopted by 001 as it is, without the contract's NOT NULLs, and a run
 * inserted before its status is written ("queued" by a platform that fills the status later).
 * Every decision read a NULL status as TERMINAL (`status NOT IN (…)` and `NOT (status = ANY (…))`
 * are NULL, not true), so the cleanup of a sibling root deleted the sandbox that run was about to
 * use. 008 now enforces the NOT NULLs (refusing loudly a table that holds NULLs) and every
 * predicate counts a NULL status as active should the constraint be dropped again.
 */
const fixture = useDatabaseFixture();
const GUARD = { inFlightSeconds: 120, lockTimeoutMs: 2_000 };

async function applyMigration008(): Promise<void> {
  const migration = await readFile(
    new URL('../../infra/migrations/008_phase_functions.sql', import.meta.url),
    'utf8',
  );
  await fixture.t.db.query(migration);
}

async function setStatusNull(runId: string): Promise<void> {
  await fixture.t.db.query('UPDATE agent_runs SET status = NULL WHERE id = $1::text', [runId]);
}

async function statusNullable(): Promise<boolean> {
  const { rows } = await fixture.t.db.query<{ nullable: string }>(
    `SELECT is_nullable AS nullable FROM information_schema.columns
     WHERE table_schema = current_schema() AND table_name = 'agent_runs' AND column_name = 'status'`,
  );
  return rows[0]!.nullable === 'YES';
}

describe('adopting a platform table without the NOT NULLs (migration 008)', () => {
  it('refuses, naming the column, a table holding a NULL status; sets NOT NULL once it is filled', async () => {
    await fixture.t.db.query('ALTER TABLE agent_runs ALTER COLUMN status DROP NOT NULL');
    const s = await finishedRootRun(fixture.t.db);
    const queued = await insertOtherRun(fixture.t.db, s, { status: 'queued' });
    await setStatusNull(queued);

    const refusal = await rejectionOf(applyMigration008());
    expect(String(refusal)).toMatch(/agent_runs\.status is NULL in 1 row/);
    expect(await statusNullable()).toBe(true);

    await fixture.t.db.query("UPDATE agent_runs SET status = 'queued' WHERE id = $1::text", [queued]);
    await applyMigration008();
    expect(await statusNullable()).toBe(false);
  });
});

describe('a NULL status, should the constraint be dropped again, counts as active', () => {
  beforeAll(async () => {
    await fixture.t.db.query('ALTER TABLE agent_runs ALTER COLUMN status DROP NOT NULL');
  });

  it('phase 1 defers for a sibling whose status is NULL instead of deleting the sandbox', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const queued = await insertOtherRun(fixture.t.db, s, { status: 'queued' });
    await setStatusNull(queued);

    expect(await fenceCheck(fixture.t.db, s.rootRunId)).toEqual(
      expect.objectContaining({
        outcome: FenceCheckOutcome.DEFERRED,
        reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
        blockingRunId: queued,
      }),
    );
  });

  it('phase 1 defers for a descendant (another scope) whose status is NULL', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const child = await insertOtherRun(fixture.t.db, s, {
      status: 'queued',
      runType: 'subagent',
      runtimeScopeId: `${s.runtimeScopeId}-child`,
      createdByRunId: s.rootRunId,
    });
    await setStatusNull(child);

    expect(await fenceCheck(fixture.t.db, s.rootRunId)).toEqual(
      expect.objectContaining({ outcome: FenceCheckOutcome.DEFERRED, blockingRunId: child }),
    );
  });

  it('a run whose own status is NULL is not terminal', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await setStatusNull(s.rootRunId);

    expect(await fenceCheck(fixture.t.db, s.rootRunId)).toEqual(
      expect.objectContaining({
        outcome: FenceCheckOutcome.DEFERRED,
        reason: DeferralReason.RUN_NOT_TERMINAL,
      }),
    );
  });

  it('the release guard and finalize refuse while a sibling status turned NULL after phase 1', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const queued = await insertOtherRun(fixture.t.db, s, { status: 'queued' });
    await setStatusNull(queued);

    const target = { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! };
    const guard = await beginRelease(fixture.t.db, target, GUARD);
    expect(guard).toEqual(
      expect.objectContaining({ verdict: ReleaseGuard.SCOPE_ACTIVE, activeRunId: queued }),
    );
    expect(await finalize(fixture.t.db, identity)).toEqual(
      expect.objectContaining({ outcome: FinalizeOutcome.DEFERRED, blockingRunId: queued }),
    );
  });

  it('the scope lookup stays on the partial indexes (no scan of agent_runs)', async () => {
    const plan = await fixture.t.db.withTransaction(async (tx) => {
      await tx.query('SET LOCAL enable_seqscan = off');
      const { rows } = await tx.query<{ 'QUERY PLAN': string }>(
        `EXPLAIN SELECT a.id FROM agent_runs a
          WHERE a.uid = 'u' AND a.runtime_scope_id = 's' AND a.id <> 'r'
            AND (a.status NOT IN ('completed', 'failed', 'cancelled', 'interrupted') OR a.status IS NULL)
          ORDER BY a.id LIMIT 1`,
      );
      return rows.map((row) => row['QUERY PLAN']).join('\n');
    });
    // Either the two partial indexes together (an OR of the active and the NULL-status ones) or
    // the reclaimer's plain scope index (migration 009), whichever the planner prices lower on
    // this table: what must hold is an index lookup by scope, never a scan of agent_runs.
    const partials =
      plan.includes('agent_runs_active_by_scope') && plan.includes('agent_runs_null_status_by_scope');
    expect(partials || plan.includes('agent_runs_by_scope'), plan).toBe(true);
    expect(plan).toMatch(/Index Cond: \(\(uid = 'u'::text\) AND \(runtime_scope_id = 's'::text\)\)/);
    expect(plan).not.toMatch(/Seq Scan/);
  });
});
