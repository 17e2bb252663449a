import { beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { ErrorCode, ReleaseRefusedError, RunNotFoundError } from '../../functions/cleanup/errors.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import {
  beginRelease,
  endRelease,
  ReleaseGuard,
  type ReleaseTarget,
} from '../../functions/cleanup/release-guard.ts';
import { finishedRootRun, insertOtherRun, type Scenario, upsertSandbox } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { holdScopeAdvisoryLock, rejectionOf, releaseNeeded } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

/**
 * The release guard (`runtime_cleanup_begin_release`, one statement under the scope's advisory
 * lock) on real PostgreSQL: what it refuses before any DELETE, what it skips as stale, the
 * in-flight record it writes when the delete may go ahead, and how that record keeps the scope
 * blocked until the release lowers it or its deadline passes.
 *
 * Each refusal case breaks exactly one condition of an otherwise valid release, so it fails if
 * that one check is missing.
 */
const fixture = useDatabaseFixture();
const OPTIONS = { inFlightSeconds: 120, lockTimeoutMs: 2_000 };

/** The release command phase 1 would publish for this scenario. */
async function commandFor(s: Scenario): Promise<ReleaseTarget> {
  const identity = releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId));
  return { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! };
}

interface Record_ {
  until: Date | null;
  token: string | null;
  runId: string | null;
  sandboxId: string | null;
  generation: string | null;
}

async function recordOf(s: Pick<Scenario, 'uid' | 'runtimeScopeId'>): Promise<Record_ | undefined> {
  const { rows } = await fixture.t.db.query<Record_>(
    `SELECT delete_in_flight_until AS until, delete_in_flight_token AS token, delete_in_flight_run_id AS "runId",
            delete_in_flight_sandbox_id AS "sandboxId", delete_in_flight_generation::text AS generation
     FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [s.uid, s.runtimeScopeId],
  );
  return rows[0];
}

const NO_RECORD = { until: null, token: null, runId: null, sandboxId: null, generation: null };

async function blocked(s: Pick<Scenario, 'uid' | 'runtimeScopeId'>): Promise<boolean> {
  const { rows } = await fixture.t.db.query<{ blocked: boolean }>(
    'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
    [s.uid, s.runtimeScopeId],
  );
  return rows[0]!.blocked;
}

async function clearFenceByHand(runId: string): Promise<void> {
  await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
    runId,
  ]);
}

describe('release guard: a valid release', () => {
  it('proceeds and records the delete in flight, which keeps the scope blocked after the fence drops', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 3 });
    const command = await commandFor(s);

    const guard = await beginRelease(fixture.t.db, command, OPTIONS);

    expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
    if (guard.verdict !== ReleaseGuard.PROCEED) return;
    const record = await recordOf(s);
    expect(record).toEqual({
      until: guard.inFlight.until,
      token: guard.inFlight.token,
      runId: s.rootRunId,
      sandboxId: s.sandboxId,
      generation: '3',
    });
    // About inFlightSeconds from now, on the database's clock.
    const { rows } = await fixture.t.db.query<{ seconds: number }>(
      'SELECT extract(epoch FROM $1::timestamptz - clock_timestamp())::float8 AS seconds',
      [guard.inFlight.until],
    );
    expect(rows[0]!.seconds).toBeGreaterThan(110);
    expect(rows[0]!.seconds).toBeLessThanOrEqual(120);
    expect(guard.inFlight.floorUntil).toBeNull();

    // What a forced clear would do to the fence: admission must still see the scope blocked.
    await clearFenceByHand(s.rootRunId);
    expect(await blocked(s)).toBe(true);

    expect(await endRelease(fixture.t.db, guard.inFlight)).toBeNull();
    expect(await recordOf(s)).toEqual(NO_RECORD);
    expect(await blocked(s)).toBe(false);
  });

  it('works for a fence whose raise time is NULL (a write that bypassed the trigger)', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await fixture.t.db.query(
      'UPDATE agent_runs SET runtime_cleanup_pending_since = NULL WHERE id = $1::text',
      [s.rootRunId],
    );
    const command = await commandFor(s);
    expect(command.fenceSetAt).toBeNull();

    const guard = await beginRelease(fixture.t.db, command, OPTIONS);

    expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
  });

  it('keeps a live earlier record as a floor: lowering the later one falls back to it, never below', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    // An attempt that ended without an answer left its record running (what a 5xx or a timeout does).
    const first = await beginRelease(fixture.t.db, command, { ...OPTIONS, inFlightSeconds: 600 });
    if (first.verdict !== ReleaseGuard.PROCEED) throw new Error(first.verdict);

    const second = await beginRelease(fixture.t.db, command, { ...OPTIONS, inFlightSeconds: 60 });
    if (second.verdict !== ReleaseGuard.PROCEED) throw new Error(second.verdict);

    expect(second.inFlight.floorUntil).not.toBeNull();
    expect(second.inFlight.until).toEqual(first.inFlight.until);
    // The first attempt no longer owns the record: its own end changes nothing.
    expect(await endRelease(fixture.t.db, first.inFlight)).toBeUndefined();
    expect((await recordOf(s))?.token).toBe(second.inFlight.token);
    // The second was answered: the record falls back to the first attempt's deadline.
    expect(await endRelease(fixture.t.db, second.inFlight)).toEqual(first.inFlight.until);
    await clearFenceByHand(s.rootRunId);
    expect(await blocked(s)).toBe(true);
  });

  it('cuts the record of an attempt that ended without an answer to the provisioner’s own delete time', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const guard = await beginRelease(fixture.t.db, await commandFor(s), { ...OPTIONS, inFlightSeconds: 600 });
    if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(guard.verdict);

    const until = await endRelease(fixture.t.db, guard.inFlight, 30);

    const { rows } = await fixture.t.db.query<{ seconds: number }>(
      'SELECT extract(epoch FROM $1::timestamptz - clock_timestamp())::float8 AS seconds',
      [until],
    );
    expect(rows[0]!.seconds).toBeGreaterThan(25);
    expect(rows[0]!.seconds).toBeLessThanOrEqual(30);
    await clearFenceByHand(s.rootRunId);
    expect(await blocked(s)).toBe(true);
  });

  it('stops blocking the scope once the deadline passes, even if the release never came back', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const guard = await beginRelease(fixture.t.db, await commandFor(s), { ...OPTIONS, inFlightSeconds: 0.5 });
    expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
    await clearFenceByHand(s.rootRunId);
    expect(await blocked(s)).toBe(true);

    // A crashed release: nothing lowers the record; only the database clock ends it.
    await eventually('the in-flight deadline passes', async () => !(await blocked(s)), 5_000);
    expect((await recordOf(s))?.token).toBe(
      guard.verdict === ReleaseGuard.PROCEED ? guard.inFlight.token : null,
    );
  });
});

describe('release guard: refused before any DELETE (forged or mismatched), nothing recorded', () => {
  async function expectRefused(command: ReleaseTarget, code: string, s: Scenario): Promise<void> {
    const error = await rejectionOf(beginRelease(fixture.t.db, command, OPTIONS));
    expect(error).toBeInstanceOf(ReleaseRefusedError);
    expect(error).toMatchObject({ code, retryable: false, details: { runId: command.runId } });
    expect(await recordOf(s)).toEqual(NO_RECORD);
  }

  it('a command naming another uid or scope than its run’s, even one whose sandbox matches, with RELEASE_SCOPE_MISMATCH', async () => {
    const mine = await finishedRootRun(fixture.t.db);
    const other = await finishedRootRun(fixture.t.db);
    const command = await commandFor(mine);
    // Everything about `other`'s scope checks out (its sandbox, its generation): only the run is not its.
    const forged = {
      ...command,
      uid: other.uid,
      runtimeScopeId: other.runtimeScopeId,
      sandboxId: other.sandboxId,
      generation: other.generation,
    };
    await expectRefused(forged, ErrorCode.RELEASE_SCOPE_MISMATCH, other);
    await expectRefused(
      { ...forged, uid: mine.uid, runtimeScopeId: other.runtimeScopeId },
      ErrorCode.RELEASE_SCOPE_MISMATCH,
      other,
    );
    await upsertSandbox(fixture.t.db, {
      uid: other.uid,
      runtimeScopeId: mine.runtimeScopeId,
      sandboxId: other.sandboxId,
      generation: other.generation,
    });
    await expectRefused(
      { ...forged, uid: other.uid, runtimeScopeId: mine.runtimeScopeId },
      ErrorCode.RELEASE_SCOPE_MISMATCH,
      { ...other, runtimeScopeId: mine.runtimeScopeId },
    );
    expect(await recordOf(mine)).toEqual(NO_RECORD);
  });

  it('a subagent run (which owns no cleanup) with RELEASE_RUN_NOT_ROOT', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    const child = await insertOtherRun(fixture.t.db, s, {
      runType: 'subagent',
      createdByRunId: s.rootRunId,
      status: 'completed',
      fence: true,
    });
    const { rows } = await fixture.t.db.query<{ since: string }>(
      'SELECT runtime_cleanup_pending_since::text AS since FROM agent_runs WHERE id = $1::text',
      [child],
    );
    await expectRefused(
      { ...command, runId: child, fenceSetAt: rows[0]!.since },
      ErrorCode.RELEASE_RUN_NOT_ROOT,
      s,
    );
  });

  it.each(['running', 'pending', 'cancel_requested', 'some_future_status'])(
    'a run whose status is %s with RELEASE_RUN_NOT_TERMINAL',
    async (status) => {
      const s = await finishedRootRun(fixture.t.db);
      const command = await commandFor(s);
      await fixture.t.db.query('UPDATE agent_runs SET status = $2::text WHERE id = $1::text', [
        s.rootRunId,
        status,
      ]);
      await expectRefused(command, ErrorCode.RELEASE_RUN_NOT_TERMINAL, s);
    },
  );

  it.each([
    ['another sandbox id', { sandboxId: 'sbx-forged' }],
    ['an older generation', { generation: 1 }],
    ['a newer generation', { generation: 3 }],
  ])('a command naming %s than the scope records, with RELEASE_SANDBOX_MISMATCH', async (_, change) => {
    const s = await finishedRootRun(fixture.t.db, { generation: 2 });
    const command = await commandFor(s);
    await expectRefused({ ...command, ...change }, ErrorCode.RELEASE_SANDBOX_MISMATCH, s);
  });

  it('a scope that records no sandbox at all, with RELEASE_SANDBOX_MISMATCH', async () => {
    const s = await finishedRootRun(fixture.t.db, { withSandbox: false });
    const { rows } = await fixture.t.db.query<{ since: string }>(
      'SELECT runtime_cleanup_pending_since::text AS since FROM agent_runs WHERE id = $1::text',
      [s.rootRunId],
    );
    const command: ReleaseTarget = {
      runId: s.rootRunId,
      uid: s.uid,
      runtimeScopeId: s.runtimeScopeId,
      sandboxId: s.sandboxId,
      generation: 1,
      fenceSetAt: rows[0]!.since,
    };
    const error = await rejectionOf(beginRelease(fixture.t.db, command, OPTIONS));
    expect(error).toMatchObject({ code: ErrorCode.RELEASE_SANDBOX_MISMATCH });
  });

  it('an unknown run with RUN_NOT_FOUND', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    const error = await rejectionOf(
      beginRelease(fixture.t.db, { ...command, runId: 'run-nobody-made' }, OPTIONS),
    );
    expect(error).toBeInstanceOf(RunNotFoundError);
    expect(await recordOf(s)).toEqual(NO_RECORD);
  });
});

describe('release guard: stale but honest, skipped, nothing recorded', () => {
  it('a fence cleared since phase 1, or raised anew, with FENCE_GONE', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    await clearFenceByHand(s.rootRunId);
    expect(await beginRelease(fixture.t.db, command, OPTIONS)).toEqual({ verdict: ReleaseGuard.FENCE_GONE });
    // Raised again: the trigger stamps a new raise time, so phase 1's capture no longer matches.
    await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = true WHERE id = $1::text', [
      s.rootRunId,
    ]);
    expect(await beginRelease(fixture.t.db, command, OPTIONS)).toEqual({ verdict: ReleaseGuard.FENCE_GONE });
    expect(await recordOf(s)).toEqual(NO_RECORD);
  });

  it.each([
    ['another run of the scope', false],
    ['a descendant in another scope', true],
  ])('an active run (%s) with SCOPE_ACTIVE', async (_, descendant) => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    const active = await insertOtherRun(fixture.t.db, s, {
      runtimeScopeId: descendant ? `${s.runtimeScopeId}-child` : s.runtimeScopeId,
      runType: descendant ? 'subagent' : 'chat',
      createdByRunId: descendant ? s.rootRunId : null,
      status: 'running',
    });
    expect(await beginRelease(fixture.t.db, command, OPTIONS)).toEqual({
      verdict: ReleaseGuard.SCOPE_ACTIVE,
      activeRunId: active,
    });
    expect(await recordOf(s)).toEqual(NO_RECORD);
  });

  it('a generation already confirmed gone with ALREADY_RELEASED', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    await fixture.t.db.query(
      `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
       WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [s.uid, s.runtimeScopeId],
    );
    expect(await beginRelease(fixture.t.db, command, OPTIONS)).toEqual({
      verdict: ReleaseGuard.ALREADY_RELEASED,
    });
  });
});

describe('release guard: serialised with admission by the scope’s advisory lock', () => {
  let impatient: Database;
  beforeAll(async () => {
    impatient = await fixture.t.connect({ maxConnections: 2 });
  });

  it('waits for an admission holding the lock and then sees the run it admitted (fresh snapshot after the lock)', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    let admitted = '';
    let admit!: () => void;
    const admitNow = new Promise<void>((resolve) => (admit = resolve));
    let locked!: () => void;
    const lockTaken = new Promise<void>((resolve) => (locked = resolve));
    // The platform's admission (docs/integration.md, "What the platform does", step 2), held open
    // between its two statements.
    const admission = fixture.t.db.withTransaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
        s.uid,
        s.runtimeScopeId,
      ]);
      locked();
      await admitNow;
      admitted = await insertOtherRun(tx, s, { status: 'running' });
    });
    await lockTaken;
    const guarding = beginRelease(impatient, command, OPTIONS);
    await eventually('the guard waiting on the scope lock', async () => {
      const { rows } = await fixture.t.db.query<{ waiting: number }>(
        `SELECT count(*)::int AS waiting FROM pg_locks
         WHERE locktype = 'advisory' AND NOT granted
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      );
      return rows[0]!.waiting === 1;
    });
    admit();
    await admission;

    expect(await guarding).toEqual({ verdict: ReleaseGuard.SCOPE_ACTIVE, activeRunId: admitted });
    expect(await recordOf(s)).toEqual(NO_RECORD);
  });

  it('gives up by lock_timeout while the lock is held too long, recording nothing (retryable)', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const command = await commandFor(s);
    const lock = await holdScopeAdvisoryLock(fixture.t.db, s);
    try {
      const error = await rejectionOf(beginRelease(impatient, command, { ...OPTIONS, lockTimeoutMs: 150 }));
      expect(error).toMatchObject({ code: InfrastructureErrorCode.DATABASE_LOCK_TIMEOUT, retryable: true });
      expect(await recordOf(s)).toEqual(NO_RECORD);
    } finally {
      await lock.release();
    }
  });

  it('holds no lock once it returned: the lock lives for its one statement only', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await beginRelease(impatient, await commandFor(s), OPTIONS);
    const { rows } = await fixture.t.db.query<{ acquired: boolean }>(
      'SELECT pg_try_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text)) AS acquired',
      [s.uid, s.runtimeScopeId],
    );
    expect(rows[0]!.acquired).toBe(true);
  });
});
