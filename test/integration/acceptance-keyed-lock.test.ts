/**
 * ADR acceptance row 3: waiting for the provider's keyed lock is bounded. With the scope's lock
 * already held, release fails explicitly (RELEASE_LOCK_TIMEOUT, retryable) once the configured
 * wait is over, and never calls the provisioner: its audit log shows no DELETE at all. The
 * overall cleanup deadline also cuts a lock wait short, and a waiter that gave up leaves no trace
 * in the lock.
 */
import { describe, expect, it } from 'vitest';
import {
  CleanupTimeoutError,
  ErrorCode,
  ProvisionerUnavailableError,
  ReleaseLockTimeoutError,
} from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { release } from '../../functions/cleanup/release.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { fenceOf } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import {
  deletesOf,
  type ProvisionedRun,
  provisionedRootRun,
  rejectionOf,
  releaseNeeded,
} from '../support/probes.ts';

const fixture = useProvisionerFixture({ tempPrefix: 'rc-keyed-lock-' });

function providerWith(releaseLockTimeoutMs: number): SandboxProvider {
  return fixture.testProvider({ releaseLockTimeoutMs }).provider;
}

/** Takes the scope's keyed lock the way another release in this process would hold it. */
function holdScopeLock(provider: SandboxProvider, run: ProvisionedRun): Promise<() => void> {
  return provider.lock.acquire(SandboxProvider.lockKey(run), {
    timeoutMs: 1_000,
    onTimeout: () => new Error('the test could not take the scope lock'),
  });
}

describe('ADR row 3: the wait for the provider keyed lock is bounded', () => {
  it('fails with RELEASE_LOCK_TIMEOUT after the lock timeout while the scope lock is held, and never sends the DELETE', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const provider = providerWith(150);
    const unlock = await holdScopeLock(provider, run);

    const error = await rejectionOf(release(identity, { provider, runtimeCleanupTimeoutMs: 10_000 }));

    expect(error).toBeInstanceOf(ReleaseLockTimeoutError);
    expect(error).toMatchObject({
      code: ErrorCode.RELEASE_LOCK_TIMEOUT,
      retryable: true,
      details: { uid: run.uid, runtimeScopeId: run.runtimeScopeId, lockTimeoutMs: 150 },
    });
    expect(deletesOf(fixture.provisioner, run.sandboxId)).toEqual([]);
    expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(true);
    expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(true);

    // The lock was the only obstacle: once it is free the same release goes through.
    unlock();
    expect((await release(identity, { provider, runtimeCleanupTimeoutMs: 10_000 })).outcome).toBe(
      ReleaseOutcome.DELETED,
    );
    expect(deletesOf(fixture.provisioner, run.sandboxId)).toHaveLength(1);
  });

  it('lets the overall cleanup deadline abort a lock wait (CLEANUP_TIMEOUT), and the abandoned waiter never gets the lock', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const provider = providerWith(30_000);
    const unlock = await holdScopeLock(provider, run);

    const error = await rejectionOf(release(identity, { provider, runtimeCleanupTimeoutMs: 150 }));

    expect(error).toBeInstanceOf(CleanupTimeoutError);
    expect(error).toMatchObject({ code: ErrorCode.CLEANUP_TIMEOUT, retryable: true });
    expect(deletesOf(fixture.provisioner, run.sandboxId)).toEqual([]);
    // Had the waiter stayed queued, this unlock would hand it the lock and the scope would stay held.
    unlock();
    expect(provider.lock.isHeld(SandboxProvider.lockKey(run))).toBe(false);
  });

  it("lets the caller's own deadline (the Lambda's remaining time) abort a lock wait with its reason", async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const provider = providerWith(30_000);
    const unlock = await holdScopeLock(provider, run);
    const lambdaDeadline = new AbortController();
    const reason = new CleanupTimeoutError('the invocation is about to time out', {});

    const releasing = release(identity, {
      provider,
      runtimeCleanupTimeoutMs: 30_000,
      signal: lambdaDeadline.signal,
    });
    lambdaDeadline.abort(reason);

    expect(await rejectionOf(releasing)).toBe(reason);
    unlock();
    expect(provider.lock.heldKeys).toBe(0);
    expect(deletesOf(fixture.provisioner, run.sandboxId)).toEqual([]);
  });

  it('releases the scope lock whatever the delete answered, so the next release is not blocked', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const provider = providerWith(150);
    fixture.provisioner.setFault(run.sandboxId, { status: 503, times: 1 });

    expect(
      await rejectionOf(release(identity, { provider, runtimeCleanupTimeoutMs: 10_000 })),
    ).toBeInstanceOf(ProvisionerUnavailableError);
    expect(provider.lock.isHeld(SandboxProvider.lockKey(run))).toBe(false);
    expect((await release(identity, { provider, runtimeCleanupTimeoutMs: 10_000 })).outcome).toBe(
      ReleaseOutcome.DELETED,
    );
  });

  it('sends the DELETEs of two concurrent releases of one scope one after the other', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
    const provider = providerWith(10_000);
    fixture.provisioner.setFault(run.sandboxId, { latencyMs: 150, times: 1 });

    const outcomes = await Promise.all([
      release(identity, { provider, runtimeCleanupTimeoutMs: 10_000 }),
      release(identity, { provider, runtimeCleanupTimeoutMs: 10_000 }),
    ]);

    expect(outcomes.map((result) => result.outcome)).toEqual([ReleaseOutcome.DELETED, ReleaseOutcome.ABSENT]);
    const [first, second] = deletesOf(fixture.provisioner, run.sandboxId);
    // The second request arrived only after the first was answered: the lock, not the
    // provisioner, serialised them.
    expect(second!.startedAt).toBeGreaterThanOrEqual(first!.endedAt!);
  });
});
