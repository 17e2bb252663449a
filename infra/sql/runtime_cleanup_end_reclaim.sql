-- The end of one reclaim attempt, in one statement, so a crash in between leaves no half-ended
-- record. p_ending:
--   confirmed      the provisioner confirmed the sandbox gone: the rows that named this
--                  generation are marked released (with its sandbox id and generation, as
--                  finalize marks them), the sighting goes, the tombstone stays as the guard laid
--                  it (with a listed generation, only that generation and older ones stay
--                  refused: a fresh container records at once);
--                  with p_residual_seconds set (an earlier request of the attempt went unanswered
--                  and may still act) the scopes' records and the tombstone are cut to it;
--   may_still_act  the DELETE may still act (no answer, 5xx, 202, a reset): every record of the
--                  attempt is cut to now + p_residual_seconds (never below the residual of record)
--                  and left to expire;
--   answered       the provisioner answered without deleting (a 4xx, an unconfirming 409), or
--   not_sent       the DELETE never left: every record of the attempt ends now.
CREATE OR REPLACE FUNCTION runtime_cleanup_end_reclaim(
  p_token text,
  p_sandbox_id text,
  p_generation bigint,
  p_ending text,
  p_residual_seconds double precision
) RETURNS TABLE (rows_ended integer, sighting text, tombstone text)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    residual double precision;
    ended integer;
  BEGIN
    IF p_ending NOT IN ('confirmed', 'may_still_act', 'answered', 'not_sent') THEN
      RAISE EXCEPTION 'runtime_cleanup_end_reclaim: unknown ending %', p_ending USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_ending = 'may_still_act' AND p_residual_seconds IS NULL THEN
      RAISE EXCEPTION 'runtime_cleanup_end_reclaim: may_still_act needs its residual window' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    residual := CASE WHEN p_ending IN ('may_still_act', 'confirmed') AND p_residual_seconds IS NOT NULL
                     THEN runtime_cleanup_setting_of_record('reclaim_residual_seconds', p_residual_seconds) END;
    IF p_ending = 'confirmed' THEN
      UPDATE sandbox_runtimes s
        SET released_at = now(), released_sandbox_id = s.sandbox_id, released_generation = s.generation
        WHERE s.delete_in_flight_token = p_token AND s.sandbox_id = p_sandbox_id AND s.generation = p_generation
          AND NOT runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                                      s.sandbox_id, s.generation);
    END IF;
    SELECT count(*)::int INTO ended FROM runtime_cleanup_end_delete_in_flight(p_token, NULL, residual);

    IF p_ending = 'confirmed' THEN
      DELETE FROM runtime_reclaim_sightings g WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_token = p_token;
      sighting := 'gone';
      tombstone := 'kept';
      -- Once the DELETE is confirmed, a fresh container may be recorded at once (the deleted one,
      -- and older ones, stay refused by generation) only where the listing gave the generation:
      -- it tells the deleted container from any later one. Without it nothing does, whether or not
      -- a scope named the sandbox: another scope of the same conversation, which derives the same
      -- id and was never blocked by this attempt's records, may have POSTed during the DELETE and
      -- been handed the very container deleted. So its refusal runs to the hold's end (the delete
      -- window plus margin): minutes, not the grace.
      IF EXISTS (SELECT 1 FROM runtime_reclaim_tombstones t
                 WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token
                   AND t.reclaimed_generation IS NOT NULL) THEN
        UPDATE runtime_reclaim_tombstones t
          SET refuse_all_until = CASE WHEN residual IS NULL THEN clock_timestamp()
                                      ELSE least(t.refuse_all_until, clock_timestamp() + make_interval(secs => residual)) END
          WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token;
        tombstone := 'kept for the generation';
      END IF;
    ELSIF p_ending = 'may_still_act' THEN
      UPDATE runtime_reclaim_sightings g
        SET reclaim_in_flight_until = least(g.reclaim_in_flight_until, clock_timestamp() + make_interval(secs => residual))
        WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_token = p_token;
      UPDATE runtime_reclaim_tombstones t
        SET refuse_all_until = least(t.refuse_all_until, clock_timestamp() + make_interval(secs => residual))
        WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token;
      sighting := 'quarantined';
      tombstone := 'cut';
    ELSE
      UPDATE runtime_reclaim_sightings g
        SET reclaim_in_flight_until = NULL, reclaim_in_flight_token = NULL
        WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_token = p_token;
      DELETE FROM runtime_reclaim_tombstones t WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token;
      sighting := 'kept';
      tombstone := 'gone';
    END IF;
    DELETE FROM runtime_reclaim_tombstones t WHERE greatest(t.expires_at, t.refuse_all_until) <= clock_timestamp();
    rows_ended := ended;
    RETURN NEXT;
  END
  $$;
