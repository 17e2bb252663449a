import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { DatabaseUnavailableError } from '../../functions/adapters/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { DeferralReason, FenceCheckOutcome, FinalizeOutcome } from '../../functions/cleanup/types.ts';
import { fenceOf, finishedRootRun, insertOtherRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { probeCleanupLocks, releaseNeeded } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

/** Review findings F2, F3 and F9 of the adversarial review, each reproduced as production meets it. */
const fixture = useDatabaseFixture();
let other: Database;
beforeAll(async () => {
  other = await fixture.t.connect();
});

const OPTIONS = { inFlightSeconds: 60, lockTimeoutMs: 5_000 };

describe('F2: a transaction whose client stalls is ended by the server, and its locks freed', () => {
  let stalling: Database;
  beforeAll(async () => {
    // Statement timeout 1 s, so idle-in-transaction is bounded at 1 s too.
    stalling = await openDatabase({
      url: fixture.t.url,
      driver: fixture.t.driver,
      wsProxy: fixture.t.wsProxy,
      lockTimeoutMs: 500,
      statementTimeoutMs: 1_000,
    });
  });
  afterAll(async () => {
    await stalling?.end();
  });

  it('frees the scope lock and the row lock while the client is frozen mid-transaction', async () => {
    const s = await finishedRootRun(fixture.t.db);
    let frozen!: () => void;
    let thaw!: () => void;
    const isFrozen = new Promise<void>((resolve) => (frozen = resolve));
    const thawed = new Promise<void>((resolve) => (thaw = resolve));
    let backend: number | undefined;
    let attempts = 0;
    // A Lambda frozen between two statements of a cleanup transaction, its locks taken.
    const transaction = stalling
      .withTransaction(async (tx) => {
        attempts += 1;
        const { rows } = await tx.query<{ pid: number }>(
          `SELECT pg_backend_pid() AS pid, pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text)),
                  (SELECT id FROM agent_runs WHERE id = $3::text FOR UPDATE)`,
          [s.uid, s.runtimeScopeId, s.rootRunId],
        );
        if (attempts === 1) {
          backend = rows[0]!.pid;
          frozen();
          await thawed;
        }
      })
      .catch((error: unknown) => error);
    await isFrozen;
    try {
      expect(await probeCleanupLocks(other, s)).toEqual({ rowLock: 'held', scopeLock: 'held' });
      await eventually(
        'the server ends the stalled session',
        async () => {
          const { rows } = await other.query<{ alive: boolean }>(
            'SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1::int) AS alive',
            [backend],
          );
          return !rows[0]!.alive;
        },
        30_000,
      );
      // Still frozen: nothing but the server could have freed them.
      expect(await probeCleanupLocks(other, s)).toEqual({ rowLock: 'free', scopeLock: 'free' });
    } finally {
      thaw();
    }
    const outcome = await transaction;
    // The thawed client finds its connection gone: a lost connection, tried once more on a fresh
    // one (which commits), or the server's own 25P03 reported as a retryable error.
    if (outcome !== undefined) {
      expect(outcome).toBeInstanceOf(DatabaseUnavailableError);
      expect((outcome as DatabaseUnavailableError).retryable).toBe(true);
    }
  });

  it('sets the bounds on every protocol transaction, transaction_timeout where the server has it', async () => {
    const settings = await stalling.transact<{ idle: string; tx: string | null; version: number }>(
      `SELECT current_setting('idle_in_transaction_session_timeout') AS idle,
              current_setting('transaction_timeout', true) AS tx,
              current_setting('server_version_num')::int AS version`,
    );
    const row = settings.rows[0]!;
    expect(row.idle).toBe('1s');
    // lock 500 ms + 2 × statement 1 s.
    if (row.version >= 170000) expect(row.tx).toBe('2500ms');
    else expect(row.tx).toBeNull();
  });
});

/** A platform write that bypasses the triggers: a restore, a replica-mode bulk load, a disabled trigger. */
const BYPASSES = {
  'session_replication_role = replica': async (uid: string, scope: string, generation: number) => {
    await fixture.t.db.withTransaction(async (tx) => {
      await tx.query('SET LOCAL session_replication_role = replica');
      await tx.query(
        'UPDATE sandbox_runtimes SET generation = $3::bigint WHERE uid = $1::text AND runtime_scope_id = $2::text',
        [uid, scope, generation],
      );
    });
  },
  'ALTER TABLE … DISABLE TRIGGER': async (uid: string, scope: string, generation: number) => {
    await fixture.t.db.withTransaction(async (tx) => {
      await tx.query('ALTER TABLE sandbox_runtimes DISABLE TRIGGER sandbox_runtimes_reset_released');
      await tx.query(
        'UPDATE sandbox_runtimes SET generation = $3::bigint WHERE uid = $1::text AND runtime_scope_id = $2::text',
        [uid, scope, generation],
      );
      await tx.query('ALTER TABLE sandbox_runtimes ENABLE TRIGGER sandbox_runtimes_reset_released');
    });
  },
};

describe('F3: the release mark is bound to the generation it released', () => {
  it.each(Object.keys(BYPASSES) as (keyof typeof BYPASSES)[])(
    'a new generation recorded under an old mark (%s) is still deleted, then marked',
    async (bypass) => {
      const s = await finishedRootRun(fixture.t.db, { generation: 1 });
      const first = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
      expect((await finalize(fixture.t.db, first)).outcome).toBe(FinalizeOutcome.CLEARED);

      // The next run of the scope gets generation 2, written without the trigger: released_at of
      // generation 1 stays on the row. That run ends, fenced.
      await BYPASSES[bypass](s.uid, s.runtimeScopeId, 2);
      const { rows } = await fixture.t.db.query<{ released_at: Date | null }>(
        'SELECT released_at FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
        [s.uid, s.runtimeScopeId],
      );
      expect(rows[0]!.released_at).not.toBeNull();
      const next = await insertOtherRun(fixture.t.db, s, { status: 'completed', fence: true });

      const check = await fenceCheck(fixture.t.db, next);
      expect(check.outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
      const identity = releaseNeeded(check);
      expect(identity).toMatchObject({ sandboxId: s.sandboxId, generation: 2 });
      const guard = await beginRelease(
        fixture.t.db,
        { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
        OPTIONS,
      );
      expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
      if (guard.verdict === ReleaseGuard.PROCEED) await endRelease(fixture.t.db, guard.inFlight);
      expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);

      const marked = await fixture.t.db.query<{ sandbox_id: string; generation: string }>(
        `SELECT released_sandbox_id AS sandbox_id, released_generation::text AS generation FROM sandbox_runtimes
         WHERE uid = $1::text AND runtime_scope_id = $2::text`,
        [s.uid, s.runtimeScopeId],
      );
      expect(marked.rows[0]).toEqual({ sandbox_id: s.sandboxId, generation: '2' });
      // Now it is released: a third look finds nothing to delete.
      await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = true WHERE id = $1::text', [
        next,
      ]);
      expect((await fenceCheck(fixture.t.db, next)).outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
    },
  );
});

describe('F9: no "cleaned" while a delete may still be in flight for the scope', () => {
  it('finalize defers while an earlier attempt of the delete may still act, and clears once it cannot', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const target = { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! };
    // Attempt 1 ends without an answer: the provisioner may still carry it out for a while.
    const first = await beginRelease(fixture.t.db, target, { ...OPTIONS, inFlightSeconds: 600 });
    if (first.verdict !== ReleaseGuard.PROCEED) throw new Error(`attempt 1: ${first.verdict}`);
    await endRelease(fixture.t.db, first.inFlight, 3);
    // Attempt 2 is answered; the record falls back to attempt 1's deadline.
    const second = await beginRelease(fixture.t.db, target, { ...OPTIONS, inFlightSeconds: 600 });
    if (second.verdict !== ReleaseGuard.PROCEED) throw new Error(`attempt 2: ${second.verdict}`);
    const until = await endRelease(fixture.t.db, second.inFlight);
    expect(until).not.toBeNull();

    const deferred = await finalize(fixture.t.db, identity);
    const { rows } = await other.query<{ in_flight: boolean }>(
      `SELECT delete_in_flight_until > clock_timestamp() AS in_flight FROM sandbox_runtimes
       WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [s.uid, s.runtimeScopeId],
    );
    // Only meaningful while the record was still live when finalize ran (3 s of margin).
    expect(rows[0]!.in_flight).toBe(true);
    expect(deferred).toEqual({
      outcome: FinalizeOutcome.DEFERRED,
      reason: DeferralReason.DELETE_IN_FLIGHT,
      blockingRunId: s.rootRunId,
    });
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);

    await eventually('the in-flight record ends', async () => {
      const { rows: left } = await other.query<{ in_flight: boolean }>(
        `SELECT coalesce(delete_in_flight_until > clock_timestamp(), false) AS in_flight FROM sandbox_runtimes
         WHERE uid = $1::text AND runtime_scope_id = $2::text`,
        [s.uid, s.runtimeScopeId],
      );
      return !left[0]!.in_flight;
    });
    expect((await finalize(fixture.t.db, identity)).outcome).toBe(FinalizeOutcome.CLEARED);
    const blocked = await other.query<{ blocked: boolean }>(
      'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
      [s.uid, s.runtimeScopeId],
    );
    expect(blocked.rows[0]!.blocked).toBe(false);
  });

  it("does not answer ALREADY_CLEAR (which announces 'cleaned') while the scope's delete is in flight", async () => {
    const s = await finishedRootRun(fixture.t.db);
    const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
    const guard = await beginRelease(
      fixture.t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      { ...OPTIONS, inFlightSeconds: 600 },
    );
    expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
    // The fence goes down behind the cleanup's back (a platform write), the delete still in flight.
    await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
      s.rootRunId,
    ]);
    expect(await finalize(fixture.t.db, identity)).toMatchObject({
      outcome: FinalizeOutcome.DEFERRED,
      reason: DeferralReason.DELETE_IN_FLIGHT,
    });
  });
});
