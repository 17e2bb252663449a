/**
 * `ops force-clear` run again after a lost answer recognises its own earlier clear by the audit
 * row (infra/ops/forced-clears.ts findEarlierAttempt) and then publishes `runtime-cleaned`. That
 * announcement must be as true as the one forceClear itself would make: not while the scope is
 * blocked NOW (a sibling root run's release deleting, or its fence pending — F9: "cleaned" is never
 * announced for a blocked scope), and not for a fence that was raised again and cleared since (the
 * audit row's fence is no longer the run's latest). Real PostgreSQL, the real protocol functions.
 */
import { describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { forceClear } from '../../functions/cleanup/force-clear.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { findEarlierAttempt } from '../../infra/ops/forced-clears.ts';
import { finishedRootRun, insertOtherRun, type Scenario } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';

const fixture = useDatabaseFixture();

/** A forced clear that committed; its answer is taken as lost (the test does not look at it). */
async function forceClearedRun(): Promise<{
  s: Scenario;
  retry: { runId: string; actor: string; reason: string };
}> {
  const s = await finishedRootRun(fixture.t.db, { status: 'failed' });
  const retry = { runId: s.rootRunId, actor: 'oncall', reason: 'INC-1 stuck fence' };
  await forceClear(fixture.t.db, { ...retry, dryRun: false });
  return { s, retry };
}

/** Phase 1 and the release guard for `runId`: its DELETE is now in flight for the scope. */
async function releaseStarted(runId: string) {
  const identity = releaseNeeded(await fenceCheck(fixture.t.db, runId));
  const guard = await beginRelease(
    fixture.t.db,
    { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
    { inFlightSeconds: 600, lockTimeoutMs: 5_000 },
  );
  expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
  if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error('unreachable');
  return { identity, inFlight: guard.inFlight };
}

async function scopeBlocked(s: Scenario): Promise<boolean> {
  const { rows } = await fixture.t.db.query<{ blocked: boolean }>(
    'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
    [s.uid, s.runtimeScopeId],
  );
  return rows[0]!.blocked;
}

describe("force-clear's recognition of its own earlier attempt", () => {
  it('recognises the clear when nothing happened since, and the scope is free', async () => {
    const { s, retry } = await forceClearedRun();

    const earlier = await findEarlierAttempt(fixture.t.db, retry);

    expect(earlier).toMatchObject({ uid: s.uid, runtimeScopeId: s.runtimeScopeId, blockedBy: null });
  });

  it("reports the scope blocked by a sibling root run's DELETE in flight, with the deadline", async () => {
    const { s, retry } = await forceClearedRun();
    // Meanwhile another root run of the same scope ends and its release starts deleting.
    const sibling = await insertOtherRun(fixture.t.db, s, {
      runType: 'resume',
      status: 'completed',
      fence: true,
    });
    const { inFlight } = await releaseStarted(sibling);
    // The sibling's fence alone blocks too; the delete in flight is the more urgent reason.
    expect(await scopeBlocked(s)).toBe(true);

    const earlier = await findEarlierAttempt(fixture.t.db, retry);

    expect(earlier?.blockedBy).toMatchObject({
      kind: 'delete_in_flight',
      releaseRunId: sibling,
      sandboxId: s.sandboxId,
      generation: s.generation,
    });
    expect(Date.parse((earlier!.blockedBy as { until: string }).until)).toBeGreaterThan(Date.now());
    await endRelease(fixture.t.db, inFlight);
  });

  it("reports the scope blocked by another root run's pending fence", async () => {
    const { s, retry } = await forceClearedRun();
    await insertOtherRun(fixture.t.db, s, { runType: 'resume', status: 'completed', fence: true });

    const earlier = await findEarlierAttempt(fixture.t.db, retry);

    expect(earlier?.blockedBy).toEqual({ kind: 'fence_pending' });
  });

  it('does not recognise a clear whose fence was raised again and cleared by a normal cleanup since', async () => {
    const { s, retry } = await forceClearedRun();
    // The platform raises the same run's fence again (a restore, an upsert of the run row) ...
    await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = true WHERE id = $1::text', [
      s.rootRunId,
    ]);
    // ... and the protocol cleans it up: phase 1, the guarded release, finalize.
    const { identity, inFlight } = await releaseStarted(s.rootRunId);
    await endRelease(fixture.t.db, inFlight);
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);

    // The operator's shell-history re-run is a new decision: "no pending fence" is the truth, and
    // finalize already announced the cleanup of that fence.
    expect(await findEarlierAttempt(fixture.t.db, retry)).toBeUndefined();
  });

  it('does not recognise a clear whose run row was restored with another fence timestamp', async () => {
    const { s, retry } = await forceClearedRun();
    // A trigger-bypassing restore writes the run as it was at another time: fence down, yet
    // stamped with a fence the audit row did not clear.
    await fixture.t.db.transact(
      `SET LOCAL session_replication_role = replica;
       UPDATE agent_runs SET runtime_cleanup_pending_since = now() + interval '1 second' WHERE id = '${s.rootRunId}'`,
    );

    expect(await findEarlierAttempt(fixture.t.db, retry)).toBeUndefined();
  });
});
