/**
 * Violations the chaos suite found, each kept as a small deterministic test of its cause.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../../functions/adapters/database.ts';
import { parseMessage, ReleaseCommand, RunFinishedMessage } from '../../functions/adapters/messages.ts';
import { assertSafeSandboxId } from '../../functions/adapters/provisioner-client.ts';
import { InvalidMessageError, RunNotFoundError } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease } from '../../functions/cleanup/release-guard.ts';
import { FenceCheckOutcome, FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { releaseTemplate } from '../chaos/hostile.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fenceOf, finishedRootRun, upsertSandbox } from '../support/factories.ts';
import { eventually } from '../support/stack.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  await t?.drop();
});

describe('chaos regressions', () => {
  it('survives a backend terminated while a transaction sits between two statements, and retries it', async () => {
    // Found by: db.backend_terminated on an "idle in transaction" stack backend. The pool does not
    // listen for 'error' on a client it handed out, so the lost connection was an unhandled
    // 'error' event and the whole process (every in-flight batch) died.
    const url = new URL(t.url);
    url.searchParams.set('application_name', 'chaos-regression-victim');
    const victim = await openDatabase({
      url: url.toString(),
      driver: t.driver,
      wsProxy: t.wsProxy,
      maxConnections: 2,
      lockTimeoutMs: 1_000,
      statementTimeoutMs: 5_000,
    });
    try {
      let attempts = 0;
      const result = await victim.withTransaction(async (tx) => {
        attempts += 1;
        const { rows } = await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
        if (attempts === 1) {
          const pid = rows[0]!.pid;
          await t.db.query('SELECT pg_terminate_backend($1::int)', [pid]);
          // The client is checked out and idle here: the termination reaches it as an 'error'.
          await eventually('the backend is gone', async () => {
            const left = await t.db.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1::int', [pid]);
            return left.rowCount === 0;
          });
        }
        const second = await tx.query<{ answer: number }>('SELECT 42 AS answer');
        return second.rows[0]!.answer;
      });
      expect(result).toBe(42);
      expect(attempts).toBe(2);
    } finally {
      await victim.end();
    }
  });

  it('keeps the fence when the scope’s sandbox was replaced under a new id with the same generation number', async () => {
    // Found by: platform.sandbox_replaced_under_new_id. Generations count per sandbox id at the
    // provisioner, so `sbx-a` generation 1 deleted and `sbx-b` generation 1 created in its place
    // looked unchanged to phase 3, which cleared the fence and marked `sbx-b` released: it was
    // never deleted (invariant 1 and a leaked sandbox).
    const s = await finishedRootRun(t.db, { generation: 1 });
    const checked = await fenceCheck(t.db, s.rootRunId);
    expect(checked.outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
    if (checked.outcome !== FenceCheckOutcome.RELEASE_NEEDED) return;

    // The delete of sbx-a generation 1 succeeded; then the platform re-provisioned under a new id.
    await upsertSandbox(t.db, {
      uid: s.uid,
      runtimeScopeId: s.runtimeScopeId,
      sandboxId: `${s.sandboxId}-v2`,
      generation: 1,
    });
    const result = await finalize(t.db, checked.identity);

    expect(result).toEqual({ outcome: FinalizeOutcome.IDENTITY_CHANGED, changed: ['sandbox'] });
    expect(await fenceOf(t.db, s.rootRunId)).toBe(true);
    const { rows } = await t.db.query<{ released: boolean }>(
      'SELECT released_at IS NOT NULL AS released FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [s.uid, s.runtimeScopeId],
    );
    expect(rows[0]!.released).toBe(false);

    // Phase 1 again captures the new sandbox, so it is the one deleted next.
    const again = await fenceCheck(t.db, s.rootRunId);
    expect(again).toMatchObject({
      outcome: FenceCheckOutcome.RELEASE_NEEDED,
      identity: { sandboxId: `${s.sandboxId}-v2`, generation: 1 },
    });
  });

  it('refuses an id holding a lone surrogate at once, as an invalid message', () => {
    // Found by: the hostile-input property (sandbox id "\ud800", a valid JSON escape). The schema
    // let it through; encodeURIComponent then threw a URIError, retried as an unknown failure until
    // the retries ran out, instead of a MESSAGE_INVALID dead letter on the first receive.
    const release = JSON.stringify({ ...releaseTemplate(), sandboxId: 'sbx-\ud800' });
    expect(() => parseMessage(ReleaseCommand, release)).toThrow(InvalidMessageError);
    expect(() => parseMessage(RunFinishedMessage, JSON.stringify({ runId: 'run-\udc00' }))).toThrow(
      InvalidMessageError,
    );
    expect(() => assertSafeSandboxId('sbx-\ud800')).toThrow(InvalidMessageError);
    // Well-formed astral characters stay valid.
    expect(parseMessage(RunFinishedMessage, JSON.stringify({ runId: 'run-😀' })).runId).toBe('run-😀');
  });

  it('refuses a release for a run that does not exist instead of acknowledging it as a gone fence', async () => {
    // Found by: input.hostile_message in a 2,000-run chaos report. The release guard read "no such
    // run" as "fence gone" and the message was acknowledged without a trace; the contract parks a
    // message about an unknown run in the DLQ with its reason.
    await expect(
      beginRelease(
        t.db,
        {
          runId: 'run-that-never-existed',
          uid: 'user-x',
          runtimeScopeId: 'scope-x',
          sandboxId: 'sbx-x',
          generation: 1,
          fenceSetAt: null,
        },
        { inFlightSeconds: 60, lockTimeoutMs: 1_000 },
      ),
    ).rejects.toBeInstanceOf(RunNotFoundError);
  });
});
