import { describe, expect, it } from 'vitest';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { ErrorCode } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { type ForceClearRequest, forceClear } from '../../functions/cleanup/force-clear.ts';
import { FenceCheckOutcome, FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { fenceOf, finishedRootRun, insertOtherRun, type Scenario } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { holdScopeAdvisoryLock } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

const fixture = useDatabaseFixture();

const request = (runId: string, extra: Partial<ForceClearRequest> = {}): ForceClearRequest => ({
  runId,
  reason: 'provisioner reports generation 0 for a sandbox at generation 1 (INC-42)',
  actor: 'alice',
  dryRun: false,
  ...extra,
});

interface ScopeState {
  fence: boolean;
  releasedAt: Date | null;
  overrides: number;
}

async function stateOf(s: Scenario): Promise<ScopeState> {
  const { rows } = await fixture.t.db.query<{ released_at: Date | null; overrides: number }>(
    `SELECT (SELECT released_at FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text),
            (SELECT count(*)::int FROM runtime_cleanup_overrides WHERE run_id = $3::text) AS overrides`,
    [s.uid, s.runtimeScopeId, s.rootRunId],
  );
  return {
    fence: await fenceOf(fixture.t.db, s.rootRunId),
    releasedAt: rows[0]!.released_at,
    overrides: rows[0]!.overrides,
  };
}

const UNTOUCHED: ScopeState = { fence: true, releasedAt: null, overrides: 0 };

describe('forceClear', () => {
  it('dry run reports the fence and the live generation under the locks and changes nothing', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 4 });
    const result = await forceClear(fixture.t.db, request(s.rootRunId, { dryRun: true }));
    expect(result.applied).toBe(false);
    expect(result.plan).toMatchObject({
      runId: s.rootRunId,
      uid: s.uid,
      runtimeScopeId: s.runtimeScopeId,
      status: 'completed',
      sandboxId: s.sandboxId,
      generation: 4,
      actor: 'alice',
    });
    expect(result.plan.fenceSetAt).toMatch(/^\d{4}-\d\d-\d\d /);
    expect(await stateOf(s)).toEqual(UNTOUCHED);
  });

  it('clears the fence, releases that generation and writes one audit row, all at once', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 2 });
    const { rows: before } = await fixture.t.db.query<{ since: string }>(
      'SELECT runtime_cleanup_pending_since::text AS since FROM agent_runs WHERE id = $1::text',
      [s.rootRunId],
    );
    const result = await forceClear(
      fixture.t.db,
      request(s.rootRunId, { reason: '  stuck since the outage  ' }),
    );
    expect(result.applied).toBe(true);
    if (!result.applied) return;

    const state = await stateOf(s);
    expect(state.fence).toBe(false);
    expect(state.releasedAt).toBeInstanceOf(Date);
    expect(state.overrides).toBe(1);
    const { rows } = await fixture.t.db.query<Record<string, unknown>>(
      `SELECT id::int AS id, run_id, uid, runtime_scope_id, sandbox_id, generation::int AS generation,
              fence_set_at::text AS fence_set_at, reason, actor
       FROM runtime_cleanup_overrides WHERE run_id = $1::text`,
      [s.rootRunId],
    );
    expect(rows[0]).toEqual({
      id: result.overrideId,
      run_id: s.rootRunId,
      uid: s.uid,
      runtime_scope_id: s.runtimeScopeId,
      sandbox_id: s.sandboxId,
      generation: 2,
      fence_set_at: before[0]!.since,
      reason: 'stuck since the outage',
      actor: 'alice',
    });
    expect(await scopeBlocked(s)).toBe(false);
  });

  it('leaves a released or newer generation alone and records no sandbox when none is live', async () => {
    const s = await finishedRootRun(fixture.t.db, { withSandbox: false });
    const result = await forceClear(fixture.t.db, request(s.rootRunId));
    expect(result).toMatchObject({ applied: true, plan: { sandboxId: null, generation: null } });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
  });

  describe('refuses, changing nothing', () => {
    it('an unknown run with RUN_NOT_FOUND', async () => {
      await expect(forceClear(fixture.t.db, request('run-that-does-not-exist'))).rejects.toMatchObject({
        code: ErrorCode.RUN_NOT_FOUND,
      });
    });

    it('a subagent run with RUN_NOT_ROOT', async () => {
      const s = await finishedRootRun(fixture.t.db);
      const child = await insertOtherRun(fixture.t.db, s, {
        runType: 'subagent',
        createdByRunId: s.rootRunId,
        status: 'completed',
        fence: true,
      });
      await expect(forceClear(fixture.t.db, request(child))).rejects.toMatchObject({
        code: ErrorCode.RUN_NOT_ROOT,
      });
      expect(await fenceOf(fixture.t.db, child)).toBe(true);
      expect(await stateOf(s)).toEqual(UNTOUCHED);
    });

    it('a run whose fence is not pending with FENCE_NOT_PENDING', async () => {
      const s = await finishedRootRun(fixture.t.db);
      await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
        s.rootRunId,
      ]);
      await expect(forceClear(fixture.t.db, request(s.rootRunId))).rejects.toMatchObject({
        code: ErrorCode.FENCE_NOT_PENDING,
      });
      expect(await stateOf(s)).toEqual({ ...UNTOUCHED, fence: false });
    });

    it('a run that is itself not terminal with RUN_NOT_TERMINAL', async () => {
      const s = await finishedRootRun(fixture.t.db, { status: 'running' });
      await expect(forceClear(fixture.t.db, request(s.rootRunId))).rejects.toMatchObject({
        code: ErrorCode.RUN_NOT_TERMINAL,
        details: { status: 'running' },
      });
      expect(await stateOf(s)).toEqual(UNTOUCHED);
    });

    it.each([
      ['another run of the scope', false],
      ['a descendant in another scope', true],
    ])('a scope with an active run (%s) with SCOPE_ACTIVE', async (_, descendant) => {
      const s = await finishedRootRun(fixture.t.db);
      const active = await insertOtherRun(fixture.t.db, s, {
        runtimeScopeId: descendant ? `${s.runtimeScopeId}-child` : s.runtimeScopeId,
        runType: descendant ? 'subagent' : 'chat',
        createdByRunId: descendant ? s.rootRunId : null,
        status: 'cancel_requested',
      });
      await expect(forceClear(fixture.t.db, request(s.rootRunId))).rejects.toMatchObject({
        code: ErrorCode.SCOPE_ACTIVE,
        details: { activeRunId: active },
      });
      expect(await stateOf(s)).toEqual(UNTOUCHED);
    });

    it.each([
      ['missing', ''],
      ['blank', '   '],
      ['too long', 'x'.repeat(501)],
      ['with a NUL', 'stuck\u0000'],
    ])('a reason that is %s with REASON_INVALID, before touching the database', async (_, reason) => {
      const s = await finishedRootRun(fixture.t.db);
      await expect(forceClear(fixture.t.db, request(s.rootRunId, { reason }))).rejects.toMatchObject({
        code: ErrorCode.REASON_INVALID,
      });
      expect(await stateOf(s)).toEqual(UNTOUCHED);
    });

    it('an empty actor with REASON_INVALID', async () => {
      const s = await finishedRootRun(fixture.t.db);
      await expect(forceClear(fixture.t.db, request(s.rootRunId, { actor: ' ' }))).rejects.toMatchObject({
        code: ErrorCode.REASON_INVALID,
        details: { field: 'actor' },
      });
    });
  });

  describe("takes the protocol's advisory lock", () => {
    it('fails by lock_timeout, changing nothing, while another transaction holds the lock', async () => {
      const s = await finishedRootRun(fixture.t.db);
      const impatient = await fixture.t.connect({ lockTimeoutMs: 200, maxConnections: 1 });
      const lock = await holdScopeAdvisoryLock(fixture.t.db, s);
      try {
        await expect(forceClear(impatient, request(s.rootRunId))).rejects.toMatchObject({
          code: InfrastructureErrorCode.DATABASE_LOCK_TIMEOUT,
        });
        expect(await stateOf(s)).toEqual(UNTOUCHED);
      } finally {
        await lock.release();
      }
      expect((await forceClear(impatient, request(s.rootRunId))).applied).toBe(true);
    });

    it('waits for the lock and only then clears the fence', async () => {
      const s = await finishedRootRun(fixture.t.db);
      const lock = await holdScopeAdvisoryLock(fixture.t.db, s);
      let settled = false;
      const clearing = forceClear(fixture.t.db, request(s.rootRunId)).finally(() => {
        settled = true;
      });
      try {
        await eventually('force-clear waiting on the advisory lock', async () => {
          const { rows } = await fixture.t.db.query<{ waiting: number }>(
            `SELECT count(*)::int AS waiting FROM pg_locks
             WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          );
          return rows[0]!.waiting === 1;
        });
        expect(settled).toBe(false);
        expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
      } finally {
        await lock.release();
      }
      expect((await clearing).applied).toBe(true);
      expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
    });
  });

  it('a late finalize or fence check of the old cleanup finds the fence clear and changes nothing', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 1 });
    const checked = await fenceCheck(fixture.t.db, s.rootRunId);
    if (checked.outcome !== FenceCheckOutcome.RELEASE_NEEDED) throw new Error(checked.outcome);
    await forceClear(fixture.t.db, request(s.rootRunId));
    // The scope moves on: a new generation is recorded for the next run's sandbox.
    await fixture.t.db.query(
      'UPDATE sandbox_runtimes SET generation = 2, released_at = NULL WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [s.uid, s.runtimeScopeId],
    );

    expect(await finalize(fixture.t.db, checked.identity)).toEqual({
      outcome: FinalizeOutcome.ALREADY_CLEAR,
    });
    expect((await fenceCheck(fixture.t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.ALREADY_CLEAN);
    const { rows } = await fixture.t.db.query<{ generation: string; released_at: Date | null }>(
      'SELECT generation, released_at FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [s.uid, s.runtimeScopeId],
    );
    expect(rows[0]).toEqual({ generation: '2', released_at: null });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
  });
});

async function scopeBlocked(s: Scenario): Promise<boolean> {
  const { rows } = await fixture.t.db.query<{ blocked: boolean }>(
    'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
    [s.uid, s.runtimeScopeId],
  );
  return rows[0]!.blocked;
}
