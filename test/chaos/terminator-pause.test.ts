/**
 * The backend terminator's pause: terminations fall "while runs execute", and a quiet window
 * (reclaimer.quiet_fleet) has no run executing, only the reclaimer. Unpaused there, the one busy
 * stack backend drew every kill: nine reclaimer runs in a row failed and invariant Q measured the
 * terminator instead of the reclaimer's brakes. Against a real PostgreSQL, a stack backend kept
 * busy the whole time: no kill while paused, and one soon after the pause ends.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { BackendTerminator } from './db-faults.ts';
import { Rng } from './random.ts';

const STACK = 'terminator-pause-stack';

let t: TestDatabase;

beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  await t?.drop();
});

describe('BackendTerminator, paused while a quiet window is open', () => {
  it('terminates no stack backend while paused, and does once the pause ends', async () => {
    const admin = await t.connect({ applicationName: 'terminator-pause-admin', maxConnections: 2 });
    const stack = await t.connect({ applicationName: STACK, maxConnections: 2 });
    let paused = true;
    let kills = 0;
    const terminator = new BackendTerminator(
      admin,
      STACK,
      new Rng(7),
      { meanIntervalMs: 50, pollMs: 10 },
      () => {
        kills += 1;
      },
      () => paused,
    );
    // The busy backend a kill would pick: one statement that lasts the whole test unless killed.
    const busy = stack.query('SELECT pg_sleep(30)').then(
      () => 'finished',
      () => 'terminated',
    );
    const seen = async () =>
      (
        await admin.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'",
          [STACK],
        )
      ).rows[0]!.n;
    while ((await seen()) === 0) await new Promise((resolve) => setTimeout(resolve, 10));
    terminator.start();
    try {
      // Twenty mean intervals paused: unpaused, this many would make a kill all but certain.
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      expect(kills).toBe(0);
      expect(await seen()).toBe(1);
      paused = false;
      await terminator.firstKill;
      expect(kills).toBeGreaterThan(0);
      expect(await busy).toBe('terminated');
    } finally {
      await terminator.stop();
    }
  });
});
