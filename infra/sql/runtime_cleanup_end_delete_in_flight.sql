-- Ends (or cuts) the delete-in-flight records one attempt wrote on sandbox_runtimes, matched by its
-- token: the one rule both deleters end their quarantine by (release: one row; reclaim: every row
-- that named the sandbox). p_residual_seconds NULL: the provisioner answered, or the DELETE was
-- never sent, so nothing of the attempt can act any more: the record falls back to p_floor_until
-- (an earlier attempt's deadline still running) or ends. Set: the DELETE may still act, so the
-- record is cut to now + that long, never below the floor and never past its own deadline.
CREATE OR REPLACE FUNCTION runtime_cleanup_end_delete_in_flight(
  p_token text, p_floor_until timestamptz, p_residual_seconds double precision
) RETURNS TABLE (uid text, runtime_scope_id text, until timestamptz)
  LANGUAGE sql VOLATILE
  AS $$
    WITH mine AS (
      SELECT s.uid, s.runtime_scope_id,
             CASE
               WHEN p_residual_seconds IS NULL
                 THEN CASE WHEN p_floor_until > clock_timestamp() THEN p_floor_until END
               ELSE least(s.delete_in_flight_until,
                          greatest(p_floor_until, clock_timestamp() + make_interval(secs => p_residual_seconds)))
             END AS until
      FROM sandbox_runtimes s
      WHERE s.delete_in_flight_token = p_token
      FOR UPDATE
    )
    UPDATE sandbox_runtimes s
    SET delete_in_flight_until = mine.until,
        delete_in_flight_token = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_token END,
        delete_in_flight_run_id = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_run_id END,
        delete_in_flight_sandbox_id = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_sandbox_id END,
        delete_in_flight_generation = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_generation END
    FROM mine
    WHERE s.uid = mine.uid AND s.runtime_scope_id = mine.runtime_scope_id
    RETURNING mine.uid, mine.runtime_scope_id, mine.until
  $$;
