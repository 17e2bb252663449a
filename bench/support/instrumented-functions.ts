/**
 * The benchmark's server-side lock-hold clock, installed into the benchmark's own databases only.
 *
 * Issue 15 asks for the advisory-lock hold itself (p99 < 5 ms). A client can only time the whole
 * message, which adds the trip back and its own event-loop delay after the locks are gone, and the
 * server's time on the message includes any wait for the lock behind another holder. So in a
 * benchmark database each decision function records, in a transaction-local setting, the moment it
 * first took the scope's advisory lock (`runtime_cleanup.lock_taken_at`, epoch seconds); an
 * observed one-trip transaction (observed-transactions.ts) reads it before COMMIT and the clock
 * after COMMIT.
 *
 * The product keeps one body per function (infra/sql/) and never notes anything: a product
 * database reads the setting as unset. The instrumented copies are generated here, at run time,
 * from those very files: the note call inserted after each line that takes a scope's advisory lock,
 * nothing else changed. So a benchmark measures the product's current decisions plus one
 * set_config per decision, never a stale restatement of them.
 */
import type { Executor } from '../../functions/adapters/database.ts';
import { type FunctionFile, loadFunctionFiles } from '../../infra/migrate.ts';

/**
 * SET LOCAL semantics (set_config(..., true)): nothing outlives the transaction, behind a
 * transaction-mode pooler too. The first lock of the transaction starts the hold (phase 1 may
 * follow a moved run to a second scope; the first lock is still held then).
 */
const NOTE_LOCK_TAKEN = `
  CREATE OR REPLACE FUNCTION runtime_cleanup_note_lock_taken() RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
    BEGIN
      IF coalesce(current_setting('runtime_cleanup.lock_taken_at', true), '') = '' THEN
        PERFORM set_config('runtime_cleanup.lock_taken_at', extract(epoch FROM clock_timestamp())::text, true);
      END IF;
    END;
    $$`;

/** A PL/pgSQL statement taking a runtime scope's advisory lock, on a line of its own. */
const SCOPE_LOCK_LINE = /^(\s*)PERFORM pg_advisory_xact_lock\(runtime_cleanup_lock_key\(.*\);\s*$/;

/**
 * The decision functions whose hold the benchmark reports (runtime_cleanup_lock_run takes phase 1's
 * lock): if one of them stops taking its lock on a line of its own, the benchmark must fail
 * rather than report no hold.
 */
export const MEASURED_FUNCTIONS = [
  'runtime_cleanup_lock_run',
  'runtime_cleanup_finalize',
  'runtime_cleanup_begin_release',
] as const;

/** The file's text with the note after each scope-lock line, or undefined when it takes none. */
export function instrumentedCopy(file: FunctionFile): string | undefined {
  let found = false;
  const lines = file.sql.split('\n').flatMap((line) => {
    const match = SCOPE_LOCK_LINE.exec(line);
    if (!match) return [line];
    found = true;
    return [line, `${match[1]}PERFORM runtime_cleanup_note_lock_taken();`];
  });
  return found ? lines.join('\n') : undefined;
}

/**
 * Installs the note function and the instrumented copies into `db` (a benchmark database, already
 * migrated); returns the functions it replaced.
 */
export async function installLockTakenNote(db: Executor): Promise<string[]> {
  const copies = (await loadFunctionFiles()).flatMap((file) => {
    const sql = instrumentedCopy(file);
    return sql === undefined ? [] : [{ name: file.name, sql }];
  });
  const names = copies.map((copy) => copy.name);
  const missing = MEASURED_FUNCTIONS.filter((name) => !names.includes(name));
  if (missing.length > 0) {
    throw new Error(
      `bench: no scope-lock line (PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(…));) found in ${missing.join(', ')}: the lock hold could not be measured`,
    );
  }
  await db.query(NOTE_LOCK_TAKEN);
  for (const copy of copies) await db.query(copy.sql);
  return names;
}
