/**
 * ADR acceptance row 4 (not run in the originating platform): retries converge idempotently.
 * Duplicate deletes, duplicate fence clears and identity drift each end in a defined outcome:
 * a fence already clear is reported, not rewritten; anything that moved since phase 1 keeps the
 * fence; ten concurrent cleanups of one run clear it exactly once; a late delete of an old
 * generation leaves the new generation's sandbox running.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { release } from '../../functions/cleanup/release.ts';
import {
  type CleanupIdentity,
  DeferralReason,
  FenceCheckOutcome,
  FinalizeOutcome,
  ReleaseOutcome,
} from '../../functions/cleanup/types.ts';
import { fenceOf, insertOtherRun, upsertSandbox } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import {
  createSandboxAt,
  deletesOf,
  type ProvisionedRun,
  pathExists,
  provisionedRootRun,
  releaseNeeded,
  type TestProvider,
} from '../support/probes.ts';

const fixture = useProvisionerFixture({ tempPrefix: 'rc-convergence-' });
let shared: TestProvider;

beforeAll(() => {
  shared = newProvider();
});

/** A provider of its own: another Lambda instance, with its own keyed lock and HTTP client. */
function newProvider(): TestProvider {
  return fixture.testProvider();
}

/** Phase 1 and phase 2, leaving the run right before finalize. */
async function checkedAndReleased(run: ProvisionedRun): Promise<CleanupIdentity> {
  const identity = releaseNeeded(await fenceCheck(fixture.t.db, run.rootRunId));
  const released = await release(identity, { provider: shared.provider, runtimeCleanupTimeoutMs: 10_000 });
  expect(released.outcome).toBe(ReleaseOutcome.DELETED);
  return identity;
}

/** The whole cleanup as the three functions chain it, reduced to "I cleared it" or "it was clear". */
async function fullCleanup(db: Database, runId: string, provider: TestProvider): Promise<string> {
  const checked = await fenceCheck(db, runId);
  if (checked.outcome === FenceCheckOutcome.ALREADY_CLEAN) return FinalizeOutcome.ALREADY_CLEAR;
  const identity = releaseNeeded(checked);
  await release(identity, { provider: provider.provider, runtimeCleanupTimeoutMs: 10_000 });
  return (await finalize(db, identity)).outcome;
}

/** Makes the pool open `count` connections by holding that many transactions open together. */
async function holdConnectionsAtOnce(db: Database, count: number): Promise<void> {
  let opened = 0;
  let allOpen: () => void = () => {};
  const barrier = new Promise<void>((resolve) => {
    allOpen = resolve;
  });
  await Promise.all(
    Array.from({ length: count }, () =>
      db.withTransaction(async () => {
        opened += 1;
        if (opened === count) allOpen();
        await barrier;
      }),
    ),
  );
}

/** `xmin` changes with every write of a row (and not with a row lock): "nothing was written". */
async function rowVersions(run: ProvisionedRun): Promise<{ run: string; sandbox: string }> {
  const { rows } = await fixture.t.db.query<{ run: string; sandbox: string }>(
    `SELECT (SELECT xmin::text FROM agent_runs WHERE id = $1::text) AS run,
            (SELECT xmin::text FROM sandbox_runtimes WHERE uid = $2::text AND runtime_scope_id = $3::text) AS sandbox`,
    [run.rootRunId, run.uid, run.runtimeScopeId],
  );
  return rows[0]!;
}

/** The platform re-creates the scope's sandbox: a new generation, recorded as the live one. */
async function recreateSandbox(run: ProvisionedRun): Promise<number> {
  const next = await createSandboxAt(fixture.provisioner.url, {
    sandboxId: run.sandboxId,
    threadId: run.threadId,
    uid: run.uid,
  });
  await upsertSandbox(fixture.t.db, { ...run, generation: next });
  return next;
}

describe('ADR row 4: finalize re-checks everything the delete relied on', () => {
  it('reports ALREADY_CLEAR without writing anything when the fence is already clear', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = await checkedAndReleased(run);
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
    const before = await rowVersions(run);

    expect(await finalize(fixture.t.db, identity)).toEqual({ outcome: FinalizeOutcome.ALREADY_CLEAR });

    expect(await rowVersions(run)).toEqual(before);
  });

  it('defers, keeping the fence, when a new active run appeared in the scope after the release', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = await checkedAndReleased(run);
    const newcomer = await insertOtherRun(fixture.t.db, run, { status: 'running' });

    expect(await finalize(fixture.t.db, identity)).toEqual({
      outcome: FinalizeOutcome.DEFERRED,
      reason: DeferralReason.ACTIVE_RUN_IN_SCOPE,
      blockingRunId: newcomer,
    });
    expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(true);
  });

  it('reports IDENTITY_CHANGED, keeping the fence, when the Workdir path changed', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = await checkedAndReleased(run);
    await fixture.t.db.query('UPDATE conversations SET workdir_path = $2::text WHERE id = $1::bigint', [
      run.conversationId,
      `${run.workdirPath}-moved`,
    ]);

    expect(await finalize(fixture.t.db, identity)).toEqual({
      outcome: FinalizeOutcome.IDENTITY_CHANGED,
      changed: ['workdir'],
    });
    expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(true);
  });

  it('reports IDENTITY_CHANGED, keeping the fence and the new sandbox, when a new generation was recorded', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = await checkedAndReleased(run);
    const next = await recreateSandbox(run);

    expect(next).toBe(run.generation + 1);
    expect(await finalize(fixture.t.db, identity)).toEqual({
      outcome: FinalizeOutcome.IDENTITY_CHANGED,
      changed: ['generation'],
    });
    expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(true);
    const { rows } = await fixture.t.db.query<{ released: boolean }>(
      'SELECT released_at IS NOT NULL AS released FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [run.uid, run.runtimeScopeId],
    );
    expect(rows[0]?.released).toBe(false);
    expect(fixture.provisioner.sandbox(run.sandboxId)?.generation).toBe(next);
  });

  it('reports IDENTITY_CHANGED, keeping the fence, when the fence was lowered and raised again since phase 1', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = await checkedAndReleased(run);
    for (const pending of [false, true]) {
      await fixture.t.db.query(
        'UPDATE agent_runs SET runtime_cleanup_pending = $2::boolean WHERE id = $1::text',
        [run.rootRunId, pending],
      );
    }

    expect(await finalize(fixture.t.db, identity)).toEqual({
      outcome: FinalizeOutcome.IDENTITY_CHANGED,
      changed: ['fence'],
    });
    expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(true);
  });
});

describe('ADR row 4: duplicate and late cleanups converge', () => {
  it('clears the fence exactly once when ten full cleanups of one run race, and none of them fails', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const racers = Array.from({ length: 10 }, () => newProvider());
    // Opening a pooled connection takes far longer than a phase (measured here: ~450 ms for nine at
    // once); warm ten up, or the first cleanup is done before the others have even started.
    await holdConnectionsAtOnce(fixture.t.db, racers.length);
    // Latency so the racers' fence checks all pass before the first finalize, and their DELETEs overlap.
    fixture.provisioner.setFault(run.sandboxId, { latencyMs: 200 });

    const outcomes = await Promise.all(
      racers.map((racer) => fullCleanup(fixture.t.db, run.rootRunId, racer)),
    );
    fixture.provisioner.clearFaults();

    expect(outcomes.filter((outcome) => outcome === FinalizeOutcome.CLEARED)).toHaveLength(1);
    expect(outcomes.filter((outcome) => outcome === FinalizeOutcome.ALREADY_CLEAR)).toHaveLength(9);
    const statuses = deletesOf(fixture.provisioner, run.sandboxId).map((entry) => entry.status);
    // The race was real: several cleanups got as far as the DELETE (all ten, as measured here).
    expect(statuses.length).toBeGreaterThan(1);
    expect(statuses.filter((status) => status === 200)).toHaveLength(1);
    expect(statuses.every((status) => status === 200 || status === 404 || status === 409)).toBe(true);
    expect(await fenceOf(fixture.t.db, run.rootRunId)).toBe(false);
    expect(fixture.provisioner.isProcessAlive(run.pid)).toBe(false);
  });

  it('answers a duplicate release after the clear with ABSENT, and its finalize with ALREADY_CLEAR', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const identity = await checkedAndReleased(run);
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);

    const again = await release(identity, { provider: shared.provider, runtimeCleanupTimeoutMs: 10_000 });

    expect(again.outcome).toBe(ReleaseOutcome.ABSENT);
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.ALREADY_CLEAR);
  });

  it('answers a late release of generation 1 with SUPERSEDED and leaves the generation-2 sandbox running', async () => {
    const run = await provisionedRootRun(fixture.t.db, fixture.provisioner);
    const oldIdentity = await checkedAndReleased(run);
    expect((await finalize(fixture.t.db, oldIdentity)).outcome).toBe(FinalizeOutcome.CLEARED);
    // The scope is free again: the platform admits a new run and re-creates the sandbox.
    await insertOtherRun(fixture.t.db, run, { status: 'running' });
    const next = await recreateSandbox(run);
    const live = fixture.provisioner.sandbox(run.sandboxId)!;

    const late = await release(oldIdentity, { provider: shared.provider, runtimeCleanupTimeoutMs: 10_000 });

    expect(oldIdentity.generation).toBe(1);
    expect(next).toBe(2);
    expect(late.outcome).toBe(ReleaseOutcome.SUPERSEDED);
    expect(deletesOf(fixture.provisioner, run.sandboxId).at(-1)).toMatchObject({
      status: 409,
      generation: 1,
    });
    expect(fixture.provisioner.sandbox(run.sandboxId)).toMatchObject({
      generation: 2,
      pid: live.pid,
      alive: true,
    });
    expect(fixture.provisioner.isProcessAlive(live.pid)).toBe(true);
    expect(await pathExists(live.dir)).toBe(true);
    // Its finalize changes nothing either: generation 2 is not marked released.
    expect((await finalize(fixture.t.db, oldIdentity)).outcome).toBe(FinalizeOutcome.ALREADY_CLEAR);
    const { rows } = await fixture.t.db.query<{ generation: string; released: boolean }>(
      `SELECT generation::text, released_at IS NOT NULL AS released FROM sandbox_runtimes
       WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [run.uid, run.runtimeScopeId],
    );
    expect(rows[0]).toEqual({ generation: '2', released: false });
  });
});
