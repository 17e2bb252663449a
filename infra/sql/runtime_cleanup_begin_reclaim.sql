-- The reclaim guard, the reclaimer's counterpart of runtime_cleanup_begin_release: ONE statement
-- just before each reclaim DELETE (functions/cleanup/reclaim-guard.ts). It takes the advisory lock of
-- every scope whose row names the sandbox (in key order, so two guards never deadlock) and then the
-- sandbox id's own reclaim lock (runtime_reclaim_lock_key), re-reads under them, and either refuses
-- or records the delete in flight:
--   * on every naming scope's sandbox_runtimes row (delete_in_flight_*): runtime_cleanup_blocked
--     then refuses admission and force-clear refuses, exactly as for a release;
--   * on the sighting (reclaim_in_flight_until), and in the attempt's tombstone
--     (runtime_reclaim_tombstones, one row per attempt): the trigger sandbox_runtimes_refuse_reclaimed
--     refuses a platform recording this sandbox id. The tombstone is laid here, before the DELETE,
--     so that no failure after the DELETE (the end statement lost to a database restart) can leave
--     the deleted container recordable; runtime_cleanup_end_reclaim shortens or ends it.
-- The locks end with the statement, never held across the DELETE.
--
-- READ COMMITTED is required (runtime_cleanup_require_read_committed), as for every decision: the
-- re-reads after the locks must each see what the locks' previous holders committed, which a
-- REPEATABLE READ snapshot taken when the call began would not (a run the platform admitted while the
-- guard waited for the scope's lock would go unseen). The reclaimer sends it in the same
-- one-round-trip READ COMMITTED transaction as the release guard (Database.transact).
--
-- The grace and the hold are never below the deployment's settings of record
-- (runtime_cleanup_setting_of_record): an operator's `ops reclaim` from a shell with shorter values
-- acts no more eagerly than the deployed reclaimer.
--
-- Verdicts:
--   not_sighted       the sighting is gone or younger than the grace (another reclaimer acted, or
--                     a listing found it owned meanwhile)
--   owner_changed     a scope started naming the sandbox between the locks (try next run)
--   delete_in_flight  (also) another reclaim's DELETE of this id may still act: its deadline is open
--   scope_active | scope_fenced | delete_in_flight | scope_recent   (runtime_reclaim_scope_hold)
--   proceed           the DELETE may be sent; in_flight_until says until when it may act
--
-- p_generation: the generation the DELETE will name (recorded on the rows for operators);
-- p_generation_listed: the listing gave it (only then is a record of that generation known to name
-- the deleted container once the hold is over).
CREATE OR REPLACE FUNCTION runtime_cleanup_begin_reclaim(
  p_sandbox_id text,
  p_generation bigint,
  p_generation_listed boolean,
  p_grace_seconds double precision,
  p_hold_seconds double precision,
  p_token text,
  p_lock_timeout_ms integer
) RETURNS TABLE (verdict text, uid text, runtime_scope_id text, in_flight_until timestamptz,
                 grace_seconds double precision, hold_seconds double precision)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    locked text[] := ARRAY[]::text[];
    owner record;
    hold text;
    grace double precision;
    hold_for double precision;
    new_until timestamptz;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    grace := runtime_cleanup_setting_of_record('reclaim_grace_seconds', p_grace_seconds);
    hold_for := runtime_cleanup_setting_of_record('reclaim_hold_seconds', p_hold_seconds);

    FOR owner IN
      SELECT s.uid, s.runtime_scope_id FROM sandbox_runtimes s
      WHERE s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id
      ORDER BY runtime_cleanup_lock_key(s.uid, s.runtime_scope_id), s.uid, s.runtime_scope_id
    LOOP
      PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(owner.uid, owner.runtime_scope_id));
      locked := locked || (length(owner.uid)::text || ':' || owner.uid || ':' || owner.runtime_scope_id);
    END LOOP;
    PERFORM pg_advisory_xact_lock(runtime_reclaim_lock_key(p_sandbox_id));

    IF EXISTS (
      SELECT 1 FROM sandbox_runtimes s
      WHERE (s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id)
        AND NOT ((length(s.uid)::text || ':' || s.uid || ':' || s.runtime_scope_id) = ANY (locked))
    ) THEN
      RETURN QUERY SELECT 'owner_changed'::text, NULL::text, NULL::text, NULL::timestamptz, grace, hold_for;
      RETURN;
    END IF;

    PERFORM 1 FROM runtime_reclaim_sightings g
      WHERE g.sandbox_id = p_sandbox_id
        AND g.first_seen_at <= clock_timestamp() - make_interval(secs => grace)
      FOR UPDATE;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'not_sighted'::text, NULL::text, NULL::text, NULL::timestamptz, grace, hold_for;
      RETURN;
    END IF;
    -- Another reclaim's DELETE of this id may still act (the schedule and `ops reclaim --yes`, or
    -- two invocations): its record is never overwritten, so its end cannot clear this one's, nor
    -- this one's end clear its.
    IF EXISTS (SELECT 1 FROM runtime_reclaim_sightings g
               WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_until > clock_timestamp()) THEN
      RETURN QUERY SELECT 'delete_in_flight'::text, NULL::text, NULL::text, NULL::timestamptz, grace, hold_for;
      RETURN;
    END IF;

    FOR owner IN
      SELECT s.uid, s.runtime_scope_id FROM sandbox_runtimes s
      WHERE s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id
      ORDER BY s.uid, s.runtime_scope_id
    LOOP
      hold := runtime_reclaim_scope_hold(owner.uid, owner.runtime_scope_id, grace);
      IF hold IS NOT NULL THEN
        RETURN QUERY SELECT hold, owner.uid, owner.runtime_scope_id, NULL::timestamptz, grace, hold_for;
        RETURN;
      END IF;
    END LOOP;

    new_until := clock_timestamp() + make_interval(secs => hold_for);
    UPDATE sandbox_runtimes s
      SET delete_in_flight_until = greatest(new_until, s.delete_in_flight_until),
          delete_in_flight_token = p_token,
          delete_in_flight_run_id = NULL,
          delete_in_flight_sandbox_id = p_sandbox_id,
          delete_in_flight_generation = p_generation
      WHERE s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id;
    UPDATE runtime_reclaim_sightings g
      SET reclaim_in_flight_until = new_until, reclaim_in_flight_token = p_token
      WHERE g.sandbox_id = p_sandbox_id;
    DELETE FROM runtime_reclaim_tombstones t
      WHERE greatest(t.expires_at, t.refuse_all_until) <= clock_timestamp();
    INSERT INTO runtime_reclaim_tombstones (sandbox_id, token, reclaimed_generation, reclaimed_at, refuse_all_until, expires_at)
      VALUES (p_sandbox_id, p_token,
              CASE WHEN p_generation_listed THEN p_generation END,
              now(), new_until,
              CASE WHEN p_generation_listed
                   THEN greatest(new_until, clock_timestamp() + make_interval(secs => grace))
                   ELSE new_until END);
    RETURN QUERY SELECT 'proceed'::text, NULL::text, NULL::text, new_until, grace, hold_for;
  END
  $$;
