import { describe, expect, it } from 'vitest';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { finalize } from '../../functions/cleanup/finalize.ts';
import { FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import { finishedRootRun, insertOtherRun, type Scenario } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';

/**
 * Contract v1.1 §1: `sandbox_runtimes.released_at` belongs to one (sandbox_id, generation). When
 * the platform records a new sandbox or a new generation, the row's `released_at` reads NULL
 * afterwards, whatever its statement names: the database guarantees it (migration 005), because a
 * platform upsert that kept the old release made the next cleanup see "nothing to delete" and clear
 * the fence while the new sandbox lived (issue 11.3).
 */
const fixture = useDatabaseFixture();

async function rowOf(s: Pick<Scenario, 'uid' | 'runtimeScopeId'>) {
  const { rows } = await fixture.t.db.query<{ sandbox_id: string; generation: string; released: boolean }>(
    `SELECT sandbox_id, generation::text, released_at IS NOT NULL AS released FROM sandbox_runtimes
     WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [s.uid, s.runtimeScopeId],
  );
  return rows[0];
}

/** A scope whose generation `generation` was cleaned up and confirmed released. */
async function releasedScope(generation = 1): Promise<Scenario> {
  const s = await finishedRootRun(fixture.t.db, { generation });
  await finalize(fixture.t.db, releaseNeeded(await fenceCheck(fixture.t.db, s.rootRunId)));
  expect(await rowOf(s)).toMatchObject({ released: true });
  return s;
}

/** Upserts written the ways a platform might, none of them resetting `released_at` itself. */
const UPSERTS = {
  'an upsert that does not name released_at': `
    INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
    VALUES ($1::text, $2::text, $3::text, $4::bigint)
    ON CONFLICT (uid, runtime_scope_id) DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = EXCLUDED.generation`,
  'an upsert that keeps the existing released_at on purpose': `
    INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
    VALUES ($1::text, $2::text, $3::text, $4::bigint)
    ON CONFLICT (uid, runtime_scope_id)
    DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = EXCLUDED.generation, released_at = sandbox_runtimes.released_at`,
  'an upsert that copies a released_at it was given': `
    INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation, released_at)
    VALUES ($1::text, $2::text, $3::text, $4::bigint, now())
    ON CONFLICT (uid, runtime_scope_id)
    DO UPDATE SET sandbox_id = EXCLUDED.sandbox_id, generation = EXCLUDED.generation, released_at = EXCLUDED.released_at`,
  'a plain UPDATE of the generation only': `
    UPDATE sandbox_runtimes SET sandbox_id = $3::text, generation = $4::bigint
    WHERE uid = $1::text AND runtime_scope_id = $2::text`,
} as const;

describe('released_at of a new generation reads NULL, whatever the platform writes', () => {
  it.each(Object.entries(UPSERTS))('%s, recording a new generation', async (_, statement) => {
    const s = await releasedScope(1);
    await fixture.t.db.query(statement, [s.uid, s.runtimeScopeId, s.sandboxId, 2]);
    expect(await rowOf(s)).toEqual({ sandbox_id: s.sandboxId, generation: '2', released: false });
  });

  it.each(Object.entries(UPSERTS))(
    '%s, recording a new sandbox id with the same generation number',
    async (_, statement) => {
      // Generations count per sandbox id at the provisioner: a new id can start again at 1.
      const s = await releasedScope(1);
      await fixture.t.db.query(statement, [s.uid, s.runtimeScopeId, `${s.sandboxId}-v2`, 1]);
      expect(await rowOf(s)).toEqual({ sandbox_id: `${s.sandboxId}-v2`, generation: '1', released: false });
    },
  );

  it('a first INSERT that names a released_at', async () => {
    const s = { uid: 'user-insert', runtimeScopeId: 'scope-insert' };
    await fixture.t.db.query(
      `INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation, released_at)
       VALUES ($1::text, $2::text, 'sbx-new', 1, now())`,
      [s.uid, s.runtimeScopeId],
    );
    expect(await rowOf(s)).toEqual({ sandbox_id: 'sbx-new', generation: '1', released: false });
  });
});

describe('released_at of an unchanged generation is left alone', () => {
  it('finalize marking the generation released, and an upsert re-recording that same generation', async () => {
    const s = await releasedScope(3);
    await fixture.t.db.query(UPSERTS['an upsert that does not name released_at'], [
      s.uid,
      s.runtimeScopeId,
      s.sandboxId,
      3,
    ]);
    expect(await rowOf(s)).toEqual({ sandbox_id: s.sandboxId, generation: '3', released: true });
  });
});

describe('the cleanup after a sloppy upsert', () => {
  it('deletes the new generation instead of clearing the fence as "nothing to delete"', async () => {
    // The reproduction of issue 11.3: generation 1 cleaned and released; the platform records
    // generation 2 for the next run without touching released_at; that run ends.
    const s = await releasedScope(1);
    await fixture.t.db.query(UPSERTS['an upsert that does not name released_at'], [
      s.uid,
      s.runtimeScopeId,
      s.sandboxId,
      2,
    ]);
    const next = await insertOtherRun(fixture.t.db, s, { status: 'completed', fence: true });

    expect(await fenceCheck(fixture.t.db, next)).toMatchObject({
      outcome: FenceCheckOutcome.RELEASE_NEEDED,
      identity: { sandboxId: s.sandboxId, generation: 2 },
    });
  });
});

describe('the delete-in-flight record survives a generation change', () => {
  it('keeps the scope blocked: a generation-blind DELETE may still hit the new sandbox', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 1 });
    await fixture.t.db.query(
      `UPDATE sandbox_runtimes SET delete_in_flight_until = clock_timestamp() + interval '1 minute',
              delete_in_flight_token = 't', delete_in_flight_run_id = $3::text
       WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [s.uid, s.runtimeScopeId, s.rootRunId],
    );
    await fixture.t.db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [
      s.rootRunId,
    ]);
    await fixture.t.db.query(UPSERTS['an upsert that does not name released_at'], [
      s.uid,
      s.runtimeScopeId,
      s.sandboxId,
      2,
    ]);
    const { rows } = await fixture.t.db.query<{ blocked: boolean; token: string | null }>(
      `SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked,
              (SELECT delete_in_flight_token FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text) AS token`,
      [s.uid, s.runtimeScopeId],
    );
    expect(rows[0]).toEqual({ blocked: true, token: 't' });
  });
});
