import { describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { fenceOf, finishedRootRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';

/**
 * The fence's identity (`runtime_cleanup_pending_since`) travels from phase 1 to the release guard
 * and to phase 3 in the messages. It used to be rendered with `::text` in the reading session's
 * TimeZone and DateStyle and compared as text, so a session configured otherwise read the same
 * fence as "changed": finalize answered identity_changed (a new lap, a second DELETE) and the
 * release guard fence_gone (the release dropped, the fence left up with no chain).
 *
 * Production causes modelled: an operator's `ALTER DATABASE … SET timezone / datestyle`, which
 * only sessions opened afterwards see (a warm pool keeps the old), and a pooled server connection
 * on which another client ran a session-level SET.
 */
const fixture = useDatabaseFixture();
const GUARD = { inFlightSeconds: 120, lockTimeoutMs: 2_000 };

async function otherSessionSettings(timezone: string, dateStyle: string) {
  await fixture.t.db.query(`ALTER DATABASE ${fixture.t.name} SET timezone = '${timezone}'`);
  await fixture.t.db.query(`ALTER DATABASE ${fixture.t.name} SET datestyle = '${dateStyle}'`);
  return fixture.t.connect({ maxConnections: 1 });
}

describe('fence identity read by sessions with other TimeZone and DateStyle', () => {
  it('is emitted as ISO 8601 with its offset, whatever the session renders', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const other = await otherSessionSettings('Asia/Kolkata', 'SQL, DMY');
    try {
      const identity = releaseNeeded(await fenceCheck(other, s.rootRunId));
      expect(identity.fenceSetAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d$/);
    } finally {
      await other.end();
    }
  });

  it('finalize clears a fence that phase 1 read in another time zone (same instant)', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 2 });
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const other = await otherSessionSettings('America/New_York', 'Postgres, DMY');
    try {
      const result = await finalize(other, identity);
      expect(result).toEqual(expect.objectContaining({ outcome: FinalizeOutcome.CLEARED }));
      expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(false);
    } finally {
      await other.end();
    }
  });

  it('the release guard proceeds on a fence that phase 1 read in another time zone', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const other = await otherSessionSettings('Pacific/Chatham', 'German');
    try {
      const target = { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! };
      const guard = await beginRelease(other, target, GUARD);
      expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
    } finally {
      await other.end();
    }
  });

  it('a fence text in the old session-rendered form (a message already queued) still matches', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const { rows } = await fixture.t.db.query<{ legacy: string }>(
      `SELECT (runtime_cleanup_pending_since AT TIME ZONE 'UTC')::text || '+00' AS legacy FROM agent_runs WHERE id = $1::text`,
      [s.rootRunId],
    );
    const result = await finalize(fixture.t.db, { ...identity, fenceSetAt: rows[0]!.legacy });
    expect(result).toEqual(expect.objectContaining({ outcome: FinalizeOutcome.CLEARED }));
  });

  it('a fence raised anew (another instant) is still told apart', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    await fixture.t.db.query(
      `UPDATE agent_runs SET runtime_cleanup_pending_since = runtime_cleanup_pending_since + interval '1 microsecond' WHERE id = $1::text`,
      [s.rootRunId],
    );
    const result = await finalize(fixture.t.db, identity);
    expect(result).toEqual(expect.objectContaining({ outcome: FinalizeOutcome.IDENTITY_CHANGED }));
  });

  it('the SQL functions compare instants themselves, without the adapter pinning the session', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    // A transaction whose settings override the adapter's pin: the functions alone must hold.
    const decisions = await fixture.t.db.withTransaction(async (tx) => {
      await tx.query("SET LOCAL TimeZone = 'Australia/Eucla'");
      await tx.query("SET LOCAL DateStyle = 'SQL, DMY'");
      const guard = await tx.query<{ verdict: string }>(
        'SELECT verdict FROM runtime_cleanup_begin_release($1::text, $2::text, $3::text, $4::text, $5::bigint, $6::text, 60, $7::text, 2000)',
        [
          s.rootRunId,
          s.uid,
          s.runtimeScopeId,
          identity.sandboxId,
          identity.generation,
          identity.fenceSetAt,
          'token-1',
        ],
      );
      await tx.query('UPDATE sandbox_runtimes SET delete_in_flight_until = NULL WHERE uid = $1::text', [
        s.uid,
      ]);
      const finalized = await tx.query<{ decision: string }>(
        'SELECT decision FROM runtime_cleanup_finalize($1::text, $2::text, $3::text, $4::text, $5::text, $6::bigint, $7::text)',
        [
          s.rootRunId,
          s.uid,
          s.runtimeScopeId,
          identity.workdirPath,
          identity.sandboxId,
          identity.generation,
          identity.fenceSetAt,
        ],
      );
      return [guard.rows[0]!.verdict, finalized.rows[0]!.decision];
    });
    expect(decisions).toEqual(['proceed', 'cleared']);
  });
});
