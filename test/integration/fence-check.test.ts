import { describe, expect, it } from 'vitest';
import { OwnershipConflictError, RunNotFoundError } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { DeferralReason, FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { finishedRootRun, insertConversation, insertOtherRun, insertRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';

const fixture = useDatabaseFixture();

describe('phase 1: fenceCheck', () => {
  it('resolves the full identity of a fenced terminal root run with a live sandbox', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 3 });
    const result = await fenceCheck(fixture.t.db, s.rootRunId);
    expect(result.outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
    if (result.outcome !== FenceCheckOutcome.RELEASE_NEEDED) return;
    expect(result.identity).toMatchObject({
      runId: s.rootRunId,
      uid: s.uid,
      runtimeScopeId: s.runtimeScopeId,
      workdirPath: s.workdirPath,
      sandboxId: s.sandboxId,
      generation: 3,
    });
    // ISO 8601 with its offset, whatever the session's TimeZone and DateStyle.
    expect(result.identity.fenceSetAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d$/);
  });

  it('says nothing to delete when the scope has no live sandbox generation', async () => {
    const s = await finishedRootRun(fixture.t.db, { withSandbox: false });
    const result = await fenceCheck(fixture.t.db, s.rootRunId);
    expect(result.outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
  });

  it('says nothing to delete when the live generation was already released', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await fixture.t.db.query(
      `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
       WHERE uid = $1::text`,
      [s.uid],
    );
    expect((await fenceCheck(fixture.t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
  });

  it('reports an already clean run when the fence is down', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
      s.rootRunId,
    ]);
    expect((await fenceCheck(fixture.t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.ALREADY_CLEAN);
  });

  it('never lets a subagent run own the cleanup', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const child = await insertOtherRun(fixture.t.db, s, {
      runType: 'subagent',
      createdByRunId: s.rootRunId,
      status: 'completed',
      fence: true,
    });
    expect((await fenceCheck(fixture.t.db, child)).outcome).toBe(FenceCheckOutcome.NOT_OWNER);
  });

  it('defers while the run itself is not terminal', async () => {
    const s = await finishedRootRun(fixture.t.db, { status: 'running' });
    const result = await fenceCheck(fixture.t.db, s.rootRunId);
    expect(result).toMatchObject({
      outcome: FenceCheckOutcome.DEFERRED,
      reason: DeferralReason.RUN_NOT_TERMINAL,
    });
  });

  it.each(['pending', 'running', 'cancel_requested', 'some_future_status'])(
    'defers while another run of the scope is %s',
    async (status) => {
      const s = await finishedRootRun(fixture.t.db);
      const other = await insertOtherRun(fixture.t.db, s, { status });
      const result = await fenceCheck(fixture.t.db, s.rootRunId);
      expect(result).toMatchObject({
        outcome: FenceCheckOutcome.DEFERRED,
        reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
        blockingRunId: other,
      });
    },
  );

  it('defers while a descendant subagent run in another scope is still running', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const child = await insertOtherRun(fixture.t.db, s, {
      runtimeScopeId: `${s.runtimeScopeId}-child`,
      runType: 'subagent',
      createdByRunId: s.rootRunId,
      status: 'completed',
    });
    const grandchild = await insertOtherRun(fixture.t.db, s, {
      runtimeScopeId: `${s.runtimeScopeId}-grandchild`,
      runType: 'subagent',
      createdByRunId: child,
      status: 'running',
    });
    expect(await fenceCheck(fixture.t.db, s.rootRunId)).toMatchObject({
      outcome: FenceCheckOutcome.DEFERRED,
      blockingRunId: grandchild,
    });
  });

  it('ignores terminal runs and runs of other scopes', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await insertOtherRun(fixture.t.db, s, { status: 'failed' });
    await insertOtherRun(fixture.t.db, s, {
      runtimeScopeId: 'another-scope',
      status: 'running',
    });
    expect((await fenceCheck(fixture.t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
  });

  it('refuses an unknown run with a non-retryable error', async () => {
    const error = await fenceCheck(fixture.t.db, 'no-such-run').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunNotFoundError);
    expect((error as RunNotFoundError).retryable).toBe(false);
  });

  it('refuses a run whose conversation is missing', async () => {
    const runId = await insertRun(fixture.t.db, {
      uid: 'u-missing',
      conversationId: null,
      threadId: 'thread-that-does-not-exist',
      runtimeScopeId: 'scope-missing',
      status: 'completed',
      fence: true,
    });
    const error = await fenceCheck(fixture.t.db, runId).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OwnershipConflictError);
    expect((error as OwnershipConflictError).details.reason).toBe('conversation_missing');
  });

  it('refuses a run whose conversation belongs to another uid', async () => {
    const conversation = await insertConversation(fixture.t.db, { uid: 'someone-else' });
    const runId = await insertRun(fixture.t.db, {
      uid: 'u-owner',
      conversationId: conversation.id,
      threadId: conversation.threadId,
      runtimeScopeId: 'scope-x',
      status: 'completed',
      fence: true,
    });
    const error = await fenceCheck(fixture.t.db, runId).catch((e: unknown) => e);
    expect((error as OwnershipConflictError).details.reason).toBe('conversation_uid_mismatch');
  });

  it('finds the conversation by thread id when conversation_id is not set', async () => {
    const conversation = await insertConversation(fixture.t.db, { uid: 'u-thread' });
    const runId = await insertRun(fixture.t.db, {
      uid: 'u-thread',
      conversationId: null,
      threadId: conversation.threadId,
      runtimeScopeId: 'scope-thread',
      status: 'completed',
      fence: true,
    });
    const result = await fenceCheck(fixture.t.db, runId);
    expect(result.outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
  });
});
