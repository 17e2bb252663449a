/**
 * ADR acceptance row 2: the fence is cleared only after a successful delete and the final
 * re-check. While the delete is blocked, after it fails and after it times out, the fence stays
 * up, the scope stays blocked for admission, and a retry starts from the same identity. Only
 * finalize, after a release that succeeded, clears it. Also: a timed-out release leaves no request
 * running at the provisioner (the abort really closes the HTTP exchange).
 */
import { describe, expect, it } from 'vitest';
import {
  CleanupTimeoutError,
  ErrorCode,
  GenerationAnomalyError,
  ProvisionerConnectionError,
  ProvisionerDeleteTimeoutError,
  ProvisionerUnavailableError,
} from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { release } from '../../functions/cleanup/release.ts';
import { type CleanupIdentity, FinalizeOutcome, ReleaseOutcome } from '../../functions/cleanup/types.ts';
import type { Fault } from '../../infra/local/provisioner/server.ts';
import { fenceOf } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import {
  deletesOf,
  isDeleteOf,
  type ProvisionedRun,
  pathExists,
  provisionedRootRun,
  rejectionOf,
  releaseNeeded,
  type TestProvider,
} from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

const fixture = useProvisionerFixture({ tempPrefix: 'rc-fence-' });

/** Everything that says "the old runtime is not confirmed gone" for this run, checked at once. */
async function expectFenceHeld(run: ProvisionedRun, identity: CleanupIdentity): Promise<void> {
  expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(true);
  const { rows } = await fixture.t.db.query<{ blocked: boolean; fence_set_at: string; released: boolean }>(
    `SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked,
            (SELECT to_json(runtime_cleanup_pending_since) #>> '{}' FROM agent_runs WHERE id = $3::text) AS fence_set_at,
            (SELECT released_at IS NOT NULL FROM sandbox_runtimes
              WHERE uid = $1::text AND runtime_scope_id = $2::text) AS released`,
    [run.uid, run.runtimeScopeId, run.rootRunId],
  );
  // The platform admits no new run in the scope, and nothing was written about this fence.
  expect(rows[0]).toEqual({ blocked: true, fence_set_at: identity.fenceSetAt, released: false });
  // A retry starts over from phase 1 and finds the very same work to do.
  expect(releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId))).toEqual(identity);
}

/** After a failure: retry with the fault gone, and show that only finalize then clears the fence. */
async function expectRetrySucceedsAndOnlyFinalizeClears(
  run: ProvisionedRun,
  identity: CleanupIdentity,
  sandboxes: TestProvider,
): Promise<void> {
  fixture.provisioner.clearFaults();
  const released = await release(identity, { provider: sandboxes.provider, runtimeCleanupTimeoutMs: 10_000 });
  expect([ReleaseOutcome.DELETED, ReleaseOutcome.ABSENT]).toContain(released.outcome);
  // The delete is confirmed, but release alone never touches the fence.
  expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(true);
  expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
  expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(false);
  expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(false);
}

describe('ADR row 2: the fence stays up while the release is blocked, fails or times out', () => {
  it('keeps the fence while the DELETE hangs at the provisioner', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const sandboxes = fixture.testProvider();
    fixture.provisioner.setFault(run.sandboxId, { hang: true });
    const deadline = new AbortController();

    const releasing = release(identity, {
      provider: sandboxes.provider,
      runtimeCleanupTimeoutMs: 20_000,
      signal: deadline.signal,
    });
    await fixture.provisioner.waitForRequest(isDeleteOf(run.sandboxId), 5_000);
    await expectFenceHeld(run, identity);

    deadline.abort(new CleanupTimeoutError('the caller gave up', {}));
    expect(await rejectionOf(releasing)).toBeInstanceOf(CleanupTimeoutError);
    await expectFenceHeld(run, identity);
    expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(true);
    await expectRetrySucceedsAndOnlyFinalizeClears(run, identity, sandboxes);
  });

  /** Each failure the provisioner or the network can produce, and what release must report. */
  const failures: Array<{
    name: string;
    fault: Fault;
    provisionerDeleteTimeoutMs?: number;
    runtimeCleanupTimeoutMs?: number;
    error: new (...args: never[]) => Error;
    code: string;
    retryable: boolean;
  }> = [
    {
      name: 'a 503 from the provisioner',
      fault: { status: 503 },
      error: ProvisionerUnavailableError,
      code: ErrorCode.PROVISIONER_UNAVAILABLE,
      retryable: true,
    },
    {
      name: 'a 409 naming an older generation (anomaly)',
      fault: { conflictGeneration: 0 },
      error: GenerationAnomalyError,
      code: ErrorCode.GENERATION_ANOMALY,
      retryable: false,
    },
    {
      name: 'a connection reset before any answer (twice: the internal retry too)',
      fault: { reset: true },
      error: ProvisionerConnectionError,
      code: ErrorCode.PROVISIONER_CONNECTION,
      retryable: true,
    },
    {
      name: 'the provisioner delete timeout',
      fault: { hang: true },
      provisionerDeleteTimeoutMs: 150,
      error: ProvisionerDeleteTimeoutError,
      code: ErrorCode.PROVISIONER_DELETE_TIMEOUT,
      retryable: true,
    },
    {
      name: 'the overall runtime cleanup timeout',
      fault: { hang: true },
      runtimeCleanupTimeoutMs: 150,
      error: CleanupTimeoutError,
      code: ErrorCode.CLEANUP_TIMEOUT,
      retryable: true,
    },
  ];

  it.each(failures)(
    'keeps the fence after $name, until a later successful release and finalize',
    async (failure) => {
      const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
      const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
      const sandboxes = fixture.testProvider({
        provisionerDeleteTimeoutMs: failure.provisionerDeleteTimeoutMs ?? 10_000,
      });
      fixture.provisioner.setFault(run.sandboxId, failure.fault);

      const error = await rejectionOf(
        release(identity, {
          provider: sandboxes.provider,
          runtimeCleanupTimeoutMs: failure.runtimeCleanupTimeoutMs ?? 10_000,
        }),
      );

      expect(error).toBeInstanceOf(failure.error);
      expect(error).toMatchObject({ code: failure.code, retryable: failure.retryable });
      await expectFenceHeld(run, identity);
      // None of these failures touched the sandbox: the old runtime really still exists.
      expect(fixture.provisioner.sandbox(run.sandboxId)?.pid).toBe(run.pid);
      expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(true);
      expect(await pathExists(run.dir)).toBe(true);
      await expectRetrySucceedsAndOnlyFinalizeClears(run, identity, sandboxes);
    },
  );

  it('keeps the fence when the sandbox was deleted but the answer was lost and the retry also failed', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const sandboxes = fixture.testProvider();
    // The first DELETE really deletes and its answer is lost; the internal retry is then refused.
    fixture.provisioner.setFault(run.sandboxId, { reset: true, afterHandling: true, times: 1 });
    fixture.provisioner.setFault(run.sandboxId, { status: 503 });

    const error = await rejectionOf(
      release(identity, { provider: sandboxes.provider, runtimeCleanupTimeoutMs: 10_000 }),
    );

    expect(error).toBeInstanceOf(ProvisionerUnavailableError);
    expect(deletesOf(fixture.provisioner, run.sandboxId)[0]?.deletedGeneration).toBe(run.generation);
    // Gone at the provisioner but not confirmed to us: the fence must still say "not confirmed".
    await expectFenceHeld(run, identity);
    // The next attempt hears 404, which is success, and only then may finalize clear the fence.
    await expectRetrySucceedsAndOnlyFinalizeClears(run, identity, sandboxes);
  });
});

describe('a timed-out release leaves nothing running at the provisioner', () => {
  it.each([
    {
      name: 'the overall cleanup deadline',
      runtimeCleanupTimeoutMs: 150,
      provisionerDeleteTimeoutMs: 10_000,
    },
    {
      name: 'the provisioner delete timeout',
      runtimeCleanupTimeoutMs: 10_000,
      provisionerDeleteTimeoutMs: 150,
    },
  ])(
    'closes the hung DELETE when $name passes: in-flight drops to 0 and the request is recorded as aborted',
    async (limits) => {
      const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
      const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
      const sandboxes = fixture.testProvider({
        provisionerDeleteTimeoutMs: limits.provisionerDeleteTimeoutMs,
      });
      fixture.provisioner.setFault(run.sandboxId, { hang: true });

      await rejectionOf(
        release(identity, {
          provider: sandboxes.provider,
          runtimeCleanupTimeoutMs: limits.runtimeCleanupTimeoutMs,
        }),
      );

      await eventually(
        'the provisioner to see the client leave',
        async () => fixture.provisioner.inFlight() === 0,
        5_000,
      );
      const [entry, ...more] = deletesOf(fixture.provisioner, run.sandboxId);
      expect(more).toEqual([]);
      expect(entry).toMatchObject({ outcome: 'aborted', fault: 'hang' });
      expect(entry?.deletedGeneration).toBeUndefined();
      // Even clearing the fault now cannot resume a delete nobody is waiting for.
      fixture.provisioner.clearFaults();
      expect(fixture.provisioner.sandbox(run.sandboxId)?.pid).toBe(run.pid);
      expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(true);
      await expectFenceHeld(run, identity);
    },
  );
});
