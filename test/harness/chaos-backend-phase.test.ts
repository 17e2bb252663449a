/**
 * The chaos suite's classifier of a terminated backend's phase (test/chaos/db-faults.ts), fed the
 * text PostgreSQL shows for what the stack sends: the sweeper's claim and unclaim are one-message
 * transactions (Database.transact), whose text begins with the BEGIN every transaction opens with,
 * and must still count as the sweeper's, not as a transaction boundary.
 */
import { describe, expect, it } from 'vitest';
import { beginTransactionStatement } from '../../functions/adapters/database.ts';
import { inlineParameters } from '../../functions/adapters/sql-literal.ts';
import { CLAIM_DUE_FENCES, UNCLAIM } from '../../functions/sweeper/sweep.ts';
import { BackendPhase, PHASE_TEXT_CHARS, phaseOf } from '../chaos/db-faults.ts';

/** A transaction's one message as the adapter composes it (`transact`), as pg_stat_activity shows it. */
function oneMessage(statement: string, values: unknown[]): string {
  // Bounds with many digits: the longest BEGIN a deployment could send.
  const begin = beginTransactionStatement({
    lockTimeoutMs: 600_000,
    statementTimeoutMs: 900_000,
    idleInTransactionTimeoutMs: 900_000,
    transactionTimeoutMs: 2_400_000,
  });
  return `${begin}; ${inlineParameters(statement, values)}; COMMIT`.slice(0, PHASE_TEXT_CHARS);
}

describe('phaseOf', () => {
  it("labels the sweeper's claim and unclaim, sent inside BEGIN … COMMIT, as the sweeper's", () => {
    expect(phaseOf('active', oneMessage(CLAIM_DUE_FENCES, [3600, 200]))).toBe(BackendPhase.SWEEPER);
    expect(phaseOf('active', oneMessage(UNCLAIM, [['run-1', 'run-2']]))).toBe(BackendPhase.SWEEPER);
  });

  it('still labels a bare transaction boundary, and an idle connection, as before', () => {
    expect(phaseOf('active', 'BEGIN')).toBe(BackendPhase.TRANSACTION_BOUNDARY);
    expect(phaseOf('idle in transaction', 'COMMIT')).toBe(BackendPhase.TRANSACTION_BOUNDARY);
    expect(phaseOf('idle', oneMessage(UNCLAIM, [['run-1']]))).toBe(BackendPhase.IDLE_BETWEEN_PHASES);
    expect(phaseOf('active', 'SELECT 1')).toBe(BackendPhase.OTHER);
  });
});
