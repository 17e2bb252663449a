import type { Executor } from '../../functions/cleanup/executor.ts';

/**
 * Time passing, for the reclaimer's tests, without waiting for it. Every rule of the reclaimer
 * that involves time compares a stored instant with the database's clock (a streak's
 * `first_seen_at` against the grace, a scope's last activity, a tombstone's or a delete-in-flight
 * record's deadline, the pairing evidence's age, how long a stricter setting of record stays). Moving every such stored instant back by
 * `seconds` is, to those rules, the same as the clock moving forward: a test states "a grace
 * later" and runs at once instead of sleeping through it. Sets only; no rule's code is bypassed.
 */
export async function letTimePass(db: Executor, seconds: number): Promise<void> {
  const ago = `make_interval(secs => ${Number(seconds)})`;
  await db.query(`
    UPDATE runtime_reclaim_sightings
      SET first_seen_at = first_seen_at - ${ago}, last_seen_at = last_seen_at - ${ago},
          reclaim_in_flight_until = reclaim_in_flight_until - ${ago};
    UPDATE runtime_reclaim_tombstones
      SET reclaimed_at = reclaimed_at - ${ago}, expires_at = expires_at - ${ago},
          refuse_all_until = refuse_all_until - ${ago};
    UPDATE runtime_reclaim_pairings SET confirmed_at = confirmed_at - ${ago};
    UPDATE agent_runs
      SET created_at = created_at - ${ago}, updated_at = updated_at - ${ago}, finished_at = finished_at - ${ago};
    UPDATE runtime_cleanup_overrides SET forced_at = forced_at - ${ago};
    UPDATE runtime_cleanup_settings SET recorded_at = recorded_at - ${ago};
    UPDATE sandbox_runtimes SET delete_in_flight_until = delete_in_flight_until - ${ago}
      WHERE delete_in_flight_until IS NOT NULL;`);
}
