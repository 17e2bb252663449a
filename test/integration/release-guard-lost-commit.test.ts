import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { type AnswerDroppingProxy, startAnswerDroppingProxy } from '../support/answer-dropping-proxy.ts';
import { finishedRootRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';

/**
 * The release guard whose COMMIT answer is lost (a Neon compute restarting right after the
 * commit). `Database.transact` repeats the whole message once on a lost connection, with the same
 * token (beginRelease draws it once). The repeat used to read its own committed record as an
 * earlier attempt's delete still in flight and keep that deadline as a floor, so after an
 * ANSWERED delete the scope stayed quarantined for the whole hold (and finalize deferred).
 * A real TCP proxy between the driver and PostgreSQL drops the COMMIT's answer.
 */
const fixture = useDatabaseFixture();
let proxy: AnswerDroppingProxy;
let proxied: Database;

beforeAll(async () => {
  const direct = new URL(fixture.t.url);
  proxy = await startAnswerDroppingProxy({ host: direct.hostname, port: Number(direct.port) });
  direct.host = `127.0.0.1:${proxy.port}`;
  proxied = await openDatabase({
    url: direct.toString(),
    driver: fixture.t.driver,
    wsProxy: fixture.t.wsProxy,
    maxConnections: 2,
    lockTimeoutMs: 5_000,
    statementTimeoutMs: 30_000,
    connectTimeoutMs: 60_000,
  });
});
afterAll(async () => {
  await proxied?.end();
  await proxy?.close();
});

describe('release guard whose COMMIT answer is lost', () => {
  it('takes its own record for its own: an answered delete opens the scope at once', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const target = { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! };

    proxy.dropCommitAnswerAfter(s.rootRunId);
    const guard = await beginRelease(proxied, target, { inFlightSeconds: 600, lockTimeoutMs: 5_000 });
    expect(proxy.dropped).toBe(1);
    if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(`guard answered ${guard.verdict}`);

    // The provisioner answered: nothing of this release can act any more.
    expect(await endRelease(fixture.t.db, guard.inFlight)).toBeNull();
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
  });

  it("still keeps another attempt's live record as the floor", async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const target = { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! };

    const first = await beginRelease(fixture.t.db, target, { inFlightSeconds: 600, lockTimeoutMs: 5_000 });
    const second = await beginRelease(fixture.t.db, target, { inFlightSeconds: 60, lockTimeoutMs: 5_000 });
    if (first.verdict !== ReleaseGuard.PROCEED || second.verdict !== ReleaseGuard.PROCEED) {
      throw new Error('both guards should proceed');
    }
    // The second attempt's answer does not end the first one's possible delete.
    expect(await endRelease(fixture.t.db, second.inFlight)).not.toBeNull();
  });
});
