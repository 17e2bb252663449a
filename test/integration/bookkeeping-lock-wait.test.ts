/**
 * The bookkeeping writes wait for a row the platform holds longer than DATABASE_LOCK_TIMEOUT_MS
 * (TransactOptions.waitForRowLocks), bounded by the statement timeout, instead of giving up at the
 * lock timeout that bounds the decisions. Giving up there kept a scope quarantined for the whole
 * hold after a confirmed delete (END_RELEASE), left a reclaimed scope's rows unmarked (END_RECLAIM)
 * and failed a reclaimer run (RECORD_SIGHTINGS), only because the platform held a row a moment.
 * Real PostgreSQL; the writes' pool has a lock timeout of 200 ms, the platform holds the row for
 * well past it.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { recordSightings } from '../../functions/cleanup/reclaim.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { finishedRootRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

const fixture = useDatabaseFixture();
const LOCK_TIMEOUT_MS = 200;
/** The bookkeeping writes' pool: a lock timeout far shorter than the platform's hold below. */
let writes: Database;
/** The platform: a pool of its own, holding the row. */
let platform: Database;

beforeAll(async () => {
  writes = await fixture.t.connect({ lockTimeoutMs: LOCK_TIMEOUT_MS });
  platform = await fixture.t.connect();
});

afterAll(async () => {
  await writes?.end();
  await platform?.end();
});

const WAITING_ON_A_LOCK = `
  SELECT count(*)::int AS waiting FROM pg_stat_activity
  WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`;

/** Runs `write` while the platform holds `lockRow` for five lock timeouts after the write waits. */
async function whileThePlatformHolds<T>(
  lockRow: string,
  values: unknown[],
  write: () => Promise<T>,
): Promise<T> {
  let release!: () => void;
  let locked!: () => void;
  const releasing = new Promise<void>((resolve) => (release = resolve));
  const isLocked = new Promise<void>((resolve) => (locked = resolve));
  const holder = platform.withTransaction(async (tx) => {
    await tx.query(lockRow, values);
    locked();
    await releasing;
  });
  await isLocked;
  const running = write();
  const settled = running.then(
    () => 'settled' as const,
    () => 'settled' as const,
  );
  try {
    await eventually(
      'the write waits on the platform',
      async () =>
        (await Promise.race([
          platform.query<{ waiting: number }>(WAITING_ON_A_LOCK).then(({ rows }) => rows[0]!.waiting > 0),
          settled,
        ])) !== false,
      10_000,
    );
    // Held well past the lock timeout, measured from when the write was seen waiting.
    await Promise.race([new Promise((resolve) => setTimeout(resolve, 5 * LOCK_TIMEOUT_MS)), settled]);
  } finally {
    release();
    await holder;
  }
  return running;
}

describe('a bookkeeping write meets a row the platform holds past the lock timeout', () => {
  it('END_RELEASE waits and ends the delete-in-flight record (the scope reopens)', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const guard = await beginRelease(
      fixture.t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      { inFlightSeconds: 600, lockTimeoutMs: 5_000 },
    );
    expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
    if (guard.verdict !== ReleaseGuard.PROCEED) return;

    const until = await whileThePlatformHolds(
      'SELECT 1 FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text FOR UPDATE',
      [s.uid, s.runtimeScopeId],
      () => endRelease(writes, guard.inFlight),
    );

    expect(until).toBeNull();
    const { rows } = await platform.query<{ until: Date | null }>(
      'SELECT delete_in_flight_until AS until FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [s.uid, s.runtimeScopeId],
    );
    expect(rows[0]!.until).toBeNull();
  });

  it('RECORD_SIGHTINGS waits and records the listing', async () => {
    const sandboxId = `sbx-held-${randomUUID().slice(0, 8)}`;
    await fixture.t.db.transact(
      `INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation, first_seen_at, last_seen_at)
       VALUES ($1::text, 1, now() - interval '1 hour', now() - interval '1 hour')`,
      [sandboxId],
    );

    await whileThePlatformHolds(
      'SELECT 1 FROM runtime_reclaim_sightings WHERE sandbox_id = $1::text FOR UPDATE',
      [sandboxId],
      () =>
        recordSightings(writes, [{ sandboxId, generation: 1, status: null, identity: null }], {
          provisioner: `http://provisioner-${randomUUID().slice(0, 8)}.test`,
          evidence: null,
        }),
    );

    const { rows } = await platform.query<{ fresh: boolean }>(
      "SELECT last_seen_at > now() - interval '1 minute' AS fresh FROM runtime_reclaim_sightings WHERE sandbox_id = $1::text",
      [sandboxId],
    );
    expect(rows[0]!.fresh).toBe(true);
  });
});
