/**
 * The REPEATABLE READ race (run-driver.ts, reclaim-faults.ts `admitWhileReclaimGuardWaits`) counts as
 * played only when the scope's reclaim guard waited on the admission's lock. A cleanup of the same
 * scope also waits on that lock, and a guard of another scope waits on another key: neither may
 * count, or the coverage test would pass on a race that never met the guard.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { finishedRootRun, type Scenario } from '../support/factories.ts';
import { eventually } from '../support/stack.ts';
import { reclaimGuardWaitsForScope } from './reclaim-faults.ts';

const STACK = 'guard-wait-test-stack';

let t: TestDatabase;
let admin: Database;
let stack: Database;
let platform: Database;

beforeAll(async () => {
  t = await createTestDatabase();
  admin = await t.connect({ applicationName: 'guard-wait-test-admin', maxConnections: 2 });
  stack = await t.connect({ applicationName: STACK, maxConnections: 4, lockTimeoutMs: 20_000 });
  platform = await t.connect({ applicationName: 'guard-wait-test-platform', maxConnections: 2 });
});
afterAll(async () => {
  await t?.drop();
});

/** Holds the scope's advisory lock, as an admission does, while `during` runs. */
async function holdingScopeLock<T>(s: Scenario, during: () => Promise<T>): Promise<T> {
  let result: T | undefined;
  await platform.withTransaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
      s.uid,
      s.runtimeScopeId,
    ]);
    result = await during();
  });
  return result as T;
}

/**
 * Starts a stack statement that waits on the lock; resolves once it is seen waiting, with the
 * statement's end (wrapped: an async function's returned promise would be awaited with it).
 */
async function waitingStatement(sql: string, params: unknown[]): Promise<{ done: Promise<unknown> }> {
  const before = await waits();
  const done = stack.query(sql, params).catch((error: unknown) => error);
  await eventually('the statement waits for an advisory lock', async () => (await waits()) > before);
  return { done };
}

async function waits(): Promise<number> {
  const { rows } = await admin.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1::text`,
    [STACK],
  );
  return rows[0]!.n;
}

const BEGIN_RECLAIM = `SELECT * FROM runtime_cleanup_begin_reclaim($1::text, 1, true, 0, 60, 'guard-wait-test', 20000)`;

describe('the chaos race sees the reclaim guard of its own scope, and nothing else', () => {
  it('a cleanup of the same scope waiting on the lock is not the guard', async () => {
    const s = await finishedRootRun(t.db);
    const seen = await holdingScopeLock(s, async () => {
      const cleanup = await waitingStatement(
        'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))',
        [s.uid, s.runtimeScopeId],
      );
      const answer = await reclaimGuardWaitsForScope(admin, STACK, s);
      return { answer, cleanup };
    });
    await seen.cleanup.done;
    expect(seen.answer).toBe(false);
  });

  it("another scope's guard waiting on its own lock is not this scope's", async () => {
    const mine = await finishedRootRun(t.db);
    const other = await finishedRootRun(t.db);
    const seen = await holdingScopeLock(other, async () => {
      const guard = await waitingStatement(BEGIN_RECLAIM, [other.sandboxId]);
      return {
        mine: await reclaimGuardWaitsForScope(admin, STACK, mine),
        other: await reclaimGuardWaitsForScope(admin, STACK, other),
        guard,
      };
    });
    await seen.guard.done;
    expect(seen.mine).toBe(false);
    expect(seen.other).toBe(true);
  });

  it("the scope's guard waiting on the admission's lock is seen, and not when another application runs it", async () => {
    const s = await finishedRootRun(t.db);
    const seen = await holdingScopeLock(s, async () => {
      const guard = await waitingStatement(BEGIN_RECLAIM, [s.sandboxId]);
      return {
        stack: await reclaimGuardWaitsForScope(admin, STACK, s),
        elsewhere: await reclaimGuardWaitsForScope(admin, 'some-other-application', s),
        guard,
      };
    });
    await seen.guard.done;
    expect(seen.stack).toBe(true);
    expect(seen.elsewhere).toBe(false);
  });
});
