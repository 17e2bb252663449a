/**
 * Phase 3 on real PostgreSQL, with rows written the way the platform writes them: what it clears,
 * what it leaves alone, and how it waits for the scope's lock (bounded by `lock_timeout`).
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { DatabaseLockTimeoutError, InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { ErrorCode, RunNotFoundError } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import {
  type CleanupIdentity,
  DeferralReason,
  FenceCheckOutcome,
  FinalizeOutcome,
} from '../../functions/cleanup/types.ts';
import { fenceOf, finishedRootRun, insertOtherRun, type Scenario } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { pausingDatabase, rejectionOf, releaseNeeded } from '../support/probes.ts';

const fixture = useDatabaseFixture();
let impatient: Database;
beforeAll(async () => {
  impatient = await fixture.t.connect({ lockTimeoutMs: 100, maxConnections: 2 });
});

async function sandboxRow(s: Scenario): Promise<{ generation: string; released: boolean } | undefined> {
  const { rows } = await fixture.t.db.query<{ generation: string; released: boolean }>(
    `SELECT generation::text, released_at IS NOT NULL AS released FROM sandbox_runtimes
     WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [s.uid, s.runtimeScopeId],
  );
  return rows[0];
}

async function blocked(s: Scenario): Promise<boolean> {
  const { rows } = await fixture.t.db.query<{ blocked: boolean }>(
    'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
    [s.uid, s.runtimeScopeId],
  );
  return rows[0]!.blocked;
}

describe('phase 3: finalize', () => {
  it('clears the fence, marks the captured generation released and unblocks the scope', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 4 });
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));

    const result = await finalize(fixture.t.db, identity);

    expect(result.outcome).toBe(FinalizeOutcome.CLEARED);
    if (result.outcome === FinalizeOutcome.CLEARED) {
      expect(new Date(result.cleanedAt).toISOString()).toBe(result.cleanedAt);
    }
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
    expect(await sandboxRow(s)).toEqual({ generation: '4', released: true });
    expect(await blocked(s)).toBe(false);
  });

  it('clears a fence with nothing to delete without inventing a sandbox row', async () => {
    const s = await finishedRootRun(fixture.t.db, { withSandbox: false });
    const checked = await fenceCheck(fixture.t.db, s.rootRunId);
    expect(checked.outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
    if (checked.outcome !== FenceCheckOutcome.NOTHING_TO_DELETE) return;

    expect((await finalize(fixture.t.db, checked.identity)).outcome).toBe(FinalizeOutcome.CLEARED);
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
    expect(await sandboxRow(s)).toBeUndefined();
  });

  it("clears only its own run's fence: another root run's fence keeps the scope blocked", async () => {
    const s = await finishedRootRun(fixture.t.db);
    const sibling = await insertOtherRun(fixture.t.db, s, {
      runType: 'resume',
      status: 'failed',
      fence: true,
    });
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));

    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
    expect(await fenceOf(fixture.t.db, sibling)).toBe(true);
    expect(await blocked(s)).toBe(true);
  });

  it('defers when the run itself is no longer terminal', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    await fixture.t.db.query(`UPDATE agent_runs SET status = 'running' WHERE id = $1::text`, [s.rootRunId]);

    expect(await finalize(fixture.t.db, identity)).toEqual({
      outcome: FinalizeOutcome.DEFERRED,
      reason: DeferralReason.RUN_NOT_TERMINAL,
      blockingRunId: s.rootRunId,
    });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
  });

  it('defers while a subagent the run started is still running, even in another scope', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const child = await insertOtherRun(fixture.t.db, s, {
      runtimeScopeId: `${s.runtimeScopeId}-child`,
      runType: 'subagent',
      createdByRunId: s.rootRunId,
      status: 'running',
    });

    expect(await finalize(fixture.t.db, identity)).toMatchObject({
      outcome: FinalizeOutcome.DEFERRED,
      blockingRunId: child,
    });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
  });

  it('reports a changed Workdir when the conversation now belongs to another uid', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    await fixture.t.db.query(`UPDATE conversations SET uid = 'someone-else' WHERE id = $1::bigint`, [
      s.conversationId,
    ]);

    expect(await finalize(fixture.t.db, identity)).toEqual({
      outcome: FinalizeOutcome.IDENTITY_CHANGED,
      changed: ['workdir'],
    });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
  });

  it('reports a changed scope when handed an identity whose scope is not the run’s', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const forged: CleanupIdentity = { ...identity, runtimeScopeId: 'another-scope' };

    expect(await finalize(fixture.t.db, forged)).toMatchObject({
      outcome: FinalizeOutcome.IDENTITY_CHANGED,
      changed: expect.arrayContaining(['scope']),
    });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
  });

  it('refuses an unknown run with a non-retryable RunNotFoundError', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));

    const error = await rejectionOf(finalize(fixture.t.db, { ...identity, runId: 'no-such-run' }));

    expect(error).toBeInstanceOf(RunNotFoundError);
    expect(error).toMatchObject({ code: ErrorCode.RUN_NOT_FOUND, retryable: false });
  });

  it("waits for the scope's advisory lock no longer than lock_timeout, then fails retryably and keeps the fence", async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    // Phase 1 of a duplicate cleanup holds the scope's lock and does not commit.
    const holder = pausingDatabase(fixture.t.db);
    const holding = fenceCheck(holder, s.rootRunId);
    let error: unknown;
    try {
      await holder.paused;
      error = await rejectionOf(finalize(impatient, identity));
    } finally {
      holder.resume();
    }
    await holding;

    expect(error).toBeInstanceOf(DatabaseLockTimeoutError);
    expect(error).toMatchObject({ code: InfrastructureErrorCode.DATABASE_LOCK_TIMEOUT, retryable: true });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
    expect((await finalize(impatient, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
  });
});
