import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { OwnershipConflictError, RunNotFoundError } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { DeferralReason, FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { finishedRootRun, insertConversation, insertRun } from '../support/factories.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  await t.drop();
});

describe('phase 1: fenceCheck', () => {
  it('resolves the full identity of a fenced terminal root run with a live sandbox', async () => {
    const s = await finishedRootRun(t.db, { generation: 3 });
    const result = await fenceCheck(t.db, s.rootRunId);
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
    expect(result.identity.fenceSetAt).toMatch(/^\d{4}-\d\d-\d\d /);
  });

  it('says nothing to delete when the scope has no live sandbox generation', async () => {
    const s = await finishedRootRun(t.db, { withSandbox: false });
    const result = await fenceCheck(t.db, s.rootRunId);
    expect(result.outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
  });

  it('says nothing to delete when the live generation was already released', async () => {
    const s = await finishedRootRun(t.db);
    await t.db.query('UPDATE sandbox_runtimes SET released_at = now() WHERE uid = $1::text', [s.uid]);
    expect((await fenceCheck(t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
  });

  it('reports an already clean run when the fence is down', async () => {
    const s = await finishedRootRun(t.db);
    await t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
      s.rootRunId,
    ]);
    expect((await fenceCheck(t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.ALREADY_CLEAN);
  });

  it('never lets a subagent run own the cleanup', async () => {
    const s = await finishedRootRun(t.db);
    const child = await insertRun(t.db, {
      uid: s.uid,
      conversationId: s.conversationId,
      threadId: s.threadId,
      runtimeScopeId: s.runtimeScopeId,
      runType: 'subagent',
      createdByRunId: s.rootRunId,
      status: 'completed',
      fence: true,
    });
    expect((await fenceCheck(t.db, child)).outcome).toBe(FenceCheckOutcome.NOT_OWNER);
  });

  it('defers while the run itself is not terminal', async () => {
    const s = await finishedRootRun(t.db, { status: 'running' });
    const result = await fenceCheck(t.db, s.rootRunId);
    expect(result).toMatchObject({
      outcome: FenceCheckOutcome.DEFERRED,
      reason: DeferralReason.RUN_NOT_TERMINAL,
    });
  });

  it.each(['pending', 'running', 'cancel_requested', 'some_future_status'])(
    'defers while another run of the scope is %s',
    async (status) => {
      const s = await finishedRootRun(t.db);
      const other = await insertRun(t.db, {
        uid: s.uid,
        conversationId: s.conversationId,
        threadId: s.threadId,
        runtimeScopeId: s.runtimeScopeId,
        status,
      });
      const result = await fenceCheck(t.db, s.rootRunId);
      expect(result).toMatchObject({
        outcome: FenceCheckOutcome.DEFERRED,
        reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
        blockingRunId: other,
      });
    },
  );

  it('defers while a descendant subagent run in another scope is still running', async () => {
    const s = await finishedRootRun(t.db);
    const child = await insertRun(t.db, {
      uid: s.uid,
      conversationId: s.conversationId,
      threadId: s.threadId,
      runtimeScopeId: `${s.runtimeScopeId}-child`,
      runType: 'subagent',
      createdByRunId: s.rootRunId,
      status: 'completed',
    });
    const grandchild = await insertRun(t.db, {
      uid: s.uid,
      conversationId: s.conversationId,
      threadId: s.threadId,
      runtimeScopeId: `${s.runtimeScopeId}-grandchild`,
      runType: 'subagent',
      createdByRunId: child,
      status: 'running',
    });
    expect(await fenceCheck(t.db, s.rootRunId)).toMatchObject({
      outcome: FenceCheckOutcome.DEFERRED,
      blockingRunId: grandchild,
    });
  });

  it('ignores terminal runs and runs of other scopes', async () => {
    const s = await finishedRootRun(t.db);
    await insertRun(t.db, {
      uid: s.uid,
      conversationId: s.conversationId,
      threadId: s.threadId,
      runtimeScopeId: s.runtimeScopeId,
      status: 'failed',
    });
    await insertRun(t.db, {
      uid: s.uid,
      conversationId: s.conversationId,
      threadId: s.threadId,
      runtimeScopeId: 'another-scope',
      status: 'running',
    });
    expect((await fenceCheck(t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
  });

  it('refuses an unknown run with a non-retryable error', async () => {
    const error = await fenceCheck(t.db, 'no-such-run').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunNotFoundError);
    expect((error as RunNotFoundError).retryable).toBe(false);
  });

  it('refuses a run whose conversation is missing', async () => {
    const runId = await insertRun(t.db, {
      uid: 'u-missing',
      conversationId: null,
      threadId: 'thread-that-does-not-exist',
      runtimeScopeId: 'scope-missing',
      status: 'completed',
      fence: true,
    });
    const error = await fenceCheck(t.db, runId).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OwnershipConflictError);
    expect((error as OwnershipConflictError).details.reason).toBe('conversation_missing');
  });

  it('refuses a run whose conversation belongs to another uid', async () => {
    const conversation = await insertConversation(t.db, { uid: 'someone-else' });
    const runId = await insertRun(t.db, {
      uid: 'u-owner',
      conversationId: conversation.id,
      threadId: conversation.threadId,
      runtimeScopeId: 'scope-x',
      status: 'completed',
      fence: true,
    });
    const error = await fenceCheck(t.db, runId).catch((e: unknown) => e);
    expect((error as OwnershipConflictError).details.reason).toBe('conversation_uid_mismatch');
  });

  it('finds the conversation by thread id when conversation_id is not set', async () => {
    const conversation = await insertConversation(t.db, { uid: 'u-thread' });
    const runId = await insertRun(t.db, {
      uid: 'u-thread',
      conversationId: null,
      threadId: conversation.threadId,
      runtimeScopeId: 'scope-thread',
      status: 'completed',
      fence: true,
    });
    const result = await fenceCheck(t.db, runId);
    expect(result.outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
  });
});
