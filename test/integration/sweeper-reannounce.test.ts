/**
 * The sweeper does not announce a fence again while its cleanup is visibly alive: a scope whose
 * release DELETE is in flight (the release guard's record is live). A second announcement then
 * would start a second chain beside the first — a second release command in the scope's FIFO
 * group, refused or retried while the record lasts — and a second dead letter for the same run
 * when the provisioner keeps failing. Once the record ends, the fence is announced on the next tick.
 */
import { describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { sweepFences } from '../../functions/sweeper/sweep.ts';
import { finishedRootRun } from '../support/factories.ts';
import { useDatabaseFixture, useSqsFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';

const fixture = useDatabaseFixture();
const sqsFixture = useSqsFixture();

/** Ages every fence past the sweep period, as if the platform's announcement had long been sent. */
async function ageFences(): Promise<void> {
  await fixture.t.db.query(
    `UPDATE agent_runs SET runtime_cleanup_pending_since = now() - interval '1 hour', runtime_cleanup_announced_at = NULL
     WHERE runtime_cleanup_pending`,
  );
}

const sweep = () =>
  sweepFences({ db: fixture.t.db, queues: sqsFixture.queues }, { sweepAfterSeconds: 600, limit: 10_000 });

describe('the sweeper and a release in flight', () => {
  it('skips a fence whose scope has a DELETE in flight, and announces it on the first tick after the record ends', async () => {
    const busy = await finishedRootRun(fixture.t.db);
    const idle = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, busy.rootRunId));
    const guard = await beginRelease(
      fixture.t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      { inFlightSeconds: 600, lockTimeoutMs: 1_000 },
    );
    if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(guard.verdict);
    await ageFences();

    const during = await sweep();
    expect(during.announced).toContain(idle.rootRunId);
    expect(during.announced).not.toContain(busy.rootRunId);
    // Still counted in the backlog: skipped, not forgotten.
    expect(during.pendingFences).toBeGreaterThanOrEqual(2);

    // The release answered (or gave up): the record ends, the fence is due again at once.
    await endRelease(fixture.t.db, guard.inFlight);
    const after = await sweep();
    expect(after.announced).toContain(busy.rootRunId);
  });
});
