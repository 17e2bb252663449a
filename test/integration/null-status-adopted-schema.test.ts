import { randomBytes } from 'node:crypto';
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

  it('the scope lookup stays on the partial index, which holds the NULL-status runs too', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const queued = await insertOtherRun(fixture.t.db, s, { status: 'queued' });
    await setStatusNull(queued);
    const lookup = `SELECT a.id FROM agent_runs a
      WHERE a.uid = $1::text AND a.runtime_scope_id = $2::text AND a.id <> $3::text
        AND runtime_cleanup_status_is_active(a.status)
      ORDER BY a.id LIMIT 1`;
    const { plans, found } = await fixture.t.db.withTransaction(async (tx) => {
      await tx.query('SET LOCAL enable_seqscan = off');
      // Only the partial index can serve the lookup now (rolled back with the transaction).
      await tx.query('DROP INDEX agent_runs_by_scope');
      // A prepared statement outlives a rollback: a name of its own, deallocated below.
      const name = `scope_lookup_${randomBytes(4).toString('hex')}`;
      await tx.query(`PREPARE ${name}(text, text, text) AS ${lookup}`);
      const explain = async (mode: string) => {
        await tx.query(`SET LOCAL plan_cache_mode = ${mode}`);
        const { rows } = await tx.query<{ 'QUERY PLAN': string }>(
          `EXPLAIN EXECUTE ${name}('${s.uid}', '${s.runtimeScopeId}', '${s.rootRunId}')`,
        );
        return rows.map((row) => row['QUERY PLAN']).join('\n');
      };
      // PL/pgSQL caches a generic plan (parameters, not values): it must prove the index too.
      const plans = [await explain('force_custom_plan'), await explain('force_generic_plan')];
      const { rows } = await tx.query<{ id: string }>(lookup, [s.uid, s.runtimeScopeId, s.rootRunId]);
      await tx.query(`DEALLOCATE ${name}`);
      return { plans, found: rows[0]?.id };
    });
    for (const plan of plans) {
      expect(plan).toMatch(/Index (Only )?Scan using agent_runs_active_by_scope/);
      expect(plan).not.toMatch(/Seq Scan/);
    }
    expect(found).toBe(queued);
  });
});
