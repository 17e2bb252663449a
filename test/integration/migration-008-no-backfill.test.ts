import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { finishedRootRun } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';

/**
 * Migration 008 applied to a database that already holds data. A release mark made before 008
 * names no generation; 008 used to copy the row's CURRENT (sandbox_id, generation) into it, which
 * certified as released exactly the stale marks 008 exists for: a new generation recorded under
 * an old released_at by a platform write that bypassed the 005 trigger before 008 ran. Without the
 * backfill such a mark counts as "not released": phase 1 asks for a (possibly 404) DELETE.
 *
 * Modelled by putting one row back into its pre-008 shape and applying 008's text again (it is
 * written to be re-runnable: IF NOT EXISTS / CREATE OR REPLACE).
 */
const fixture = useDatabaseFixture();

async function applyMigration008(): Promise<void> {
  const migration = await readFile(
    new URL('../../infra/migrations/008_phase_functions.sql', import.meta.url),
    'utf8',
  );
  await fixture.t.db.query(migration);
}

describe('migration 008 on a database that already has release marks', () => {
  it('does not certify as released a generation recorded under a stale released_at', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 1 });
    // Before 008: generation 1 was released (released_at set, no naming columns yet)…
    await fixture.t.db.query(
      `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = NULL, released_generation = NULL
       WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [s.uid, s.runtimeScopeId],
    );
    // …then the platform recorded generation 2 with the 005 trigger bypassed (a restore under
    // session_replication_role = replica): released_at survives on the live generation.
    await fixture.t.db.withTransaction(async (tx) => {
      await tx.query("SET LOCAL session_replication_role = 'replica'");
      await tx.query(
        'UPDATE sandbox_runtimes SET generation = 2 WHERE uid = $1::text AND runtime_scope_id = $2::text',
        [s.uid, s.runtimeScopeId],
      );
    });

    await applyMigration008();

    const checked = await fenceCheck(fixture.t.db, s.rootRunId);
    expect(checked.outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
    expect(checked).toEqual(
      expect.objectContaining({ identity: expect.objectContaining({ generation: 2 }) }),
    );
  });

  it('leaves marks that already name their generation as they are', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 3 });
    await fixture.t.db.query(
      `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
       WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [s.uid, s.runtimeScopeId],
    );

    await applyMigration008();

    expect((await fenceCheck(fixture.t.db, s.rootRunId)).outcome).toBe(FenceCheckOutcome.NOTHING_TO_DELETE);
  });
});
