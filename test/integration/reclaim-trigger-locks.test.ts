/**
 * The reclaim trigger on `sandbox_runtimes` (migration 009) serialises a platform's record with a
 * reclaim of the same sandbox id by the id's advisory lock. It must take that lock only where a
 * reclaim can be at work (an id with a sighting): one lock per recorded row made a bulk upsert of
 * 50 k sandboxes (a platform's backfill, the benchmark's dataset) fail with "out of shared memory"
 * once the locks outgrew max_locks_per_transaction. Real PostgreSQL.
 */
import { expect, it } from 'vitest';
import { useDatabaseFixture } from '../support/fixtures.ts';

const database = useDatabaseFixture();

const ADVISORY_LOCKS_HELD = `
  SELECT count(*)::int AS held FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`;

it('a bulk record of sandboxes no reclaim has seen takes no advisory lock per row', async () => {
  const held = await database.t.db.withTransaction(async (tx) => {
    await tx.query(
      `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
       SELECT 'bulk-user', 'bulk-scope-' || g, 'sbx-bulk-' || g, 1 FROM generate_series(1, 2000) AS g`,
    );
    const { rows } = await tx.query<{ held: number }>(ADVISORY_LOCKS_HELD);
    return rows[0]!.held;
  });
  expect(held).toBe(0);
});

it('a record of an id a reclaim has sighted takes that id lock (and only that one)', async () => {
  await database.t.db.query(
    `INSERT INTO runtime_reclaim_sightings (sandbox_id, first_seen_at, last_seen_at)
     VALUES ('sbx-sighted', now() - interval '1 hour', now())`,
  );
  const held = await database.t.db.withTransaction(async (tx) => {
    await tx.query(
      `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
       VALUES ('sighted-user', 'sighted-scope', 'sbx-sighted', 1), ('other-user', 'other-scope', 'sbx-other', 1)`,
    );
    const { rows } = await tx.query<{ held: number }>(ADVISORY_LOCKS_HELD);
    return rows[0]!.held;
  });
  expect(held).toBe(1);
});
