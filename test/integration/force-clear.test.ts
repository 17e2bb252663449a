import { describe, expect, it } from 'vitest';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { ErrorCode } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { type ForceClearRequest, forceClear } from '../../functions/cleanup/force-clear.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { FenceCheckOutcome, FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { fenceOf, finishedRootRun, insertOtherRun, type Scenario } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { holdScopeAdvisoryLock, rejectionOf, releaseNeeded } from '../support/probes.ts';
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
    expect(result.plan.fenceSetAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d$/);
    expect(await stateOf(s)).toEqual(UNTOUCHED);
  });

  it('clears the fence and writes one audit row at once, leaving the generation recorded as live', async () => {
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

    // Nothing confirmed the generation gone, so it is not marked released: the scope's next
    // cleanup still deletes it.
    expect(await stateOf(s)).toEqual({ fence: false, releasedAt: null, overrides: 1 });
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

  it('records no sandbox when the scope has none live', async () => {
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

describe('forceClear with another fenced run in the scope', () => {
  it('clears only the named fence; the other one keeps its fence and its cleanup still deletes the generation', async () => {
    // Two root runs of one scope ended (a chat and a resume that ran side by side): two fences.
    const s = await finishedRootRun(fixture.t.db, { generation: 5 });
    const other = await insertOtherRun(fixture.t.db, s, { runType: 'resume', status: 'failed', fence: true });

    const result = await forceClear(fixture.t.db, request(s.rootRunId));

    expect(result).toMatchObject({ applied: true, plan: { sandboxId: s.sandboxId, generation: 5 } });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
    expect(await fenceOf(fixture.t.db, other)).toBe(true);
    expect(await scopeBlocked(s)).toBe(true);
    // The other fence's cleanup is not "nothing to delete": the forced clear confirmed nothing gone.
    expect(await fenceCheck(fixture.t.db, other)).toMatchObject({
      outcome: FenceCheckOutcome.RELEASE_NEEDED,
      identity: { runId: other, sandboxId: s.sandboxId, generation: 5 },
    });
    // It is cleared only by its own cleanup or its own forced clear, with its own audit row.
    const { rows } = await fixture.t.db.query<{ run_id: string }>(
      'SELECT run_id FROM runtime_cleanup_overrides WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [s.uid, s.runtimeScopeId],
    );
    expect(rows).toEqual([{ run_id: s.rootRunId }]);
  });
});

describe('forceClear while a release DELETE may be in flight', () => {
  async function guardedRelease(s: Scenario, inFlightSeconds = 120) {
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const guard = await beginRelease(
      fixture.t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      { inFlightSeconds, lockTimeoutMs: 2_000 },
    );
    if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(`guard said ${guard.verdict}`);
    return guard.inFlight;
  }

  it('refuses with DELETE_IN_FLIGHT, naming the delete and when it may end, changing nothing (dry run too)', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 2 });
    const inFlight = await guardedRelease(s);

    for (const dryRun of [true, false]) {
      const error = await rejectionOf(forceClear(fixture.t.db, request(s.rootRunId, { dryRun })));
      expect(error).toMatchObject({
        code: ErrorCode.DELETE_IN_FLIGHT,
        retryable: false,
        details: {
          runId: s.rootRunId,
          deleteInFlightUntil: inFlight.until.toISOString(),
          deleteInFlightRunId: s.rootRunId,
          sandboxId: s.sandboxId,
          generation: 2,
        },
      });
      expect((error as Error).message).toContain(inFlight.until.toISOString());
    }
    expect(await stateOf(s)).toEqual(UNTOUCHED);
  });

  it('is allowed once the release lowered its record', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const inFlight = await guardedRelease(s);
    await expect(forceClear(fixture.t.db, request(s.rootRunId))).rejects.toMatchObject({
      code: ErrorCode.DELETE_IN_FLIGHT,
    });

    await endRelease(fixture.t.db, inFlight);

    expect((await forceClear(fixture.t.db, request(s.rootRunId))).applied).toBe(true);
    expect(await scopeBlocked(s)).toBe(false);
  });

  it('is allowed once the record’s deadline passed (a release that crashed mid-delete)', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await guardedRelease(s, 0.5);
    await expect(forceClear(fixture.t.db, request(s.rootRunId))).rejects.toMatchObject({
      code: ErrorCode.DELETE_IN_FLIGHT,
    });

    await eventually('the in-flight deadline passes', async () => {
      const { rows } = await fixture.t.db.query<{ over: boolean }>(
        `SELECT delete_in_flight_until <= clock_timestamp() AS over FROM sandbox_runtimes
         WHERE uid = $1::text AND runtime_scope_id = $2::text`,
        [s.uid, s.runtimeScopeId],
      );
      return rows[0]!.over;
    });

    expect((await forceClear(fixture.t.db, request(s.rootRunId))).applied).toBe(true);
  });

  it('waits for a writer holding the sandbox row and then sees the record it committed (FOR UPDATE)', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const writer = await fixture.t.connect({ maxConnections: 1 });
    let commit!: () => void;
    const committed = new Promise<void>((resolve) => (commit = resolve));
    let written!: () => void;
    const rowWritten = new Promise<void>((resolve) => (written = resolve));
    // A record written without the advisory lock (only the row lock), committed only after
    // force-clear has read the row: a plain read would have seen the row without it.
    const writing = writer.withTransaction(async (tx) => {
      await tx.query(
        `UPDATE sandbox_runtimes SET delete_in_flight_until = clock_timestamp() + interval '2 minutes',
                delete_in_flight_token = 'other-release', delete_in_flight_run_id = $3::text,
                delete_in_flight_sandbox_id = sandbox_id, delete_in_flight_generation = generation
         WHERE uid = $1::text AND runtime_scope_id = $2::text`,
        [s.uid, s.runtimeScopeId, s.rootRunId],
      );
      written();
      await committed;
    });
    await rowWritten;
    let settled = false;
    const clearing = forceClear(fixture.t.db, request(s.rootRunId)).finally(() => {
      settled = true;
    });
    // Its refusal may land while this test still awaits the writer, before the assertion below
    // attaches to it: marked handled here so that it is not reported as unhandled meanwhile.
    clearing.catch(() => {});
    try {
      await eventually('force-clear waiting on the sandbox row, or done without waiting', async () => {
        if (settled) return true;
        const { rows } = await fixture.t.db.query<{ waiting: number }>(
          `SELECT count(*)::int AS waiting FROM pg_locks
           WHERE NOT granted AND locktype IN ('transactionid', 'tuple')
             AND pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database())`,
        );
        return rows[0]!.waiting >= 1;
      });
      expect(settled, 'force-clear decided without waiting for the row being written').toBe(false);
    } finally {
      commit();
      await writing;
    }

    await expect(clearing).rejects.toMatchObject({ code: ErrorCode.DELETE_IN_FLIGHT });
    expect(await stateOf(s)).toEqual(UNTOUCHED);
  });
});

async function scopeBlocked(s: Scenario): Promise<boolean> {
  const { rows } = await fixture.t.db.query<{ blocked: boolean }>(
    'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
    [s.uid, s.runtimeScopeId],
  );
  return rows[0]!.blocked;
}
