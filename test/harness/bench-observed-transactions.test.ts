/**
 * The benchmark's observed one-trip transaction (bench/support/observed-transactions.ts), against
 * a stand-in for the adapter's `transactInOneMessage`: the message it composes, the result it
 * answers with, and what it reports. Against a real database: test/integration/phase-round-trips.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { observedTransact, type RoundTripTiming } from '../../bench/support/observed-transactions.ts';
import type { StatementResult } from '../../functions/adapters/database.ts';

const BEGIN = 'BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = 5000';

/** A stand-in adapter: waits `poolWaitMs` for a connection, then answers the message after `tripMs`. */
function adapter(answer: StatementResult[], timing: { poolWaitMs: number; tripMs: number }) {
  const sent: string[] = [];
  return {
    sent,
    async transactInOneMessage(compose: (begin: string) => string): Promise<StatementResult[]> {
      await new Promise((resolve) => setTimeout(resolve, timing.poolWaitMs));
      sent.push(compose(BEGIN));
      await new Promise((resolve) => setTimeout(resolve, timing.tripMs));
      return answer;
    },
  };
}

/** One result per statement of the observed message (BEGIN's and the bounds' collapsed into one). */
function answerOf(statement: StatementResult, lockTakenAt: string | null): StatementResult[] {
  return [
    { rows: [], rowCount: 0 },
    { rows: [], rowCount: 0 },
    statement,
    { rows: [{ lock_taken_at: lockTakenAt }], rowCount: 1 },
    { rows: [], rowCount: 0 },
    { rows: [{ now: '1000.250', received: '1000.200' }], rowCount: 1 },
  ];
}

describe('the observed one-trip transaction', () => {
  it('sends the product’s one message with the readings around the statement, and answers with the statement’s result', async () => {
    const db = adapter(answerOf({ rows: [{ decision: 'release_needed' }], rowCount: 1 }, '1000.240'), {
      poolWaitMs: 0,
      tripMs: 0,
    });
    const observed: RoundTripTiming[] = [];
    const answer = await observedTransact(db, (timing) => observed.push(timing))<{ decision: string }>(
      'SELECT decision FROM runtime_cleanup_fence_check($1::text)',
      ['run-1'],
    );
    expect(answer).toEqual({ rows: [{ decision: 'release_needed' }], rowCount: 1 });
    expect(db.sent).toHaveLength(1);
    const statements = db.sent[0]!.split('; ');
    expect(statements.slice(0, 2)).toEqual(BEGIN.split('; '));
    expect(statements.slice(2)).toEqual([
      "SET LOCAL runtime_cleanup.lock_taken_at = ''",
      "SELECT decision FROM runtime_cleanup_fence_check('run-1'::text)",
      "SELECT current_setting('runtime_cleanup.lock_taken_at', true) AS lock_taken_at",
      'COMMIT',
      'SELECT extract(epoch FROM clock_timestamp())::text AS now, extract(epoch FROM statement_timestamp())::text AS received',
    ]);
    expect(observed).toHaveLength(1);
    expect(observed[0]!.serverMs).toBeCloseTo(50, 6);
    expect(observed[0]!.lockHeldMs).toBeCloseTo(10, 6);
  });

  it('reports no hold when nothing noted one (a product database, a statement that took no scope lock)', async () => {
    const db = adapter(answerOf({ rows: [], rowCount: 0 }, ''), { poolWaitMs: 0, tripMs: 0 });
    const observed: RoundTripTiming[] = [];
    await observedTransact(db, (timing) => observed.push(timing))('SELECT 1', []);
    expect(observed[0]!.lockHeldMs).toBeNull();
  });

  it('times the round trip from the message’s sending, not from the wait for a pool slot', async () => {
    const db = adapter(answerOf({ rows: [], rowCount: 0 }, null), { poolWaitMs: 300, tripMs: 20 });
    const observed: RoundTripTiming[] = [];
    await observedTransact(db, (timing) => observed.push(timing))('SELECT 1', []);
    expect(observed[0]!.roundTripMs).toBeGreaterThanOrEqual(15);
    expect(observed[0]!.roundTripMs).toBeLessThan(250);
  });
});
