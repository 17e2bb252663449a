-- The release guard: ONE call in a one-round-trip transaction just before every sandbox DELETE
-- (functions/cleanup/release-guard.ts); decides under the scope's advisory lock and
-- records "a delete is in flight until T" on the scope's sandbox row, in one statement. The lock
-- lasts for that statement only, never across the DELETE.
--
-- Why a plain read before the DELETE was not enough (issue 11): a read says what was true when it
-- ran, and nothing kept the scope from reopening between that read and the DELETE. An operator's
-- forced clear could drop the fence meanwhile, the platform then admitted a new run, and the
-- provisioner (which reuses a live container on POST, and whose DELETE ignores the generation)
-- handed that run the very sandbox the late DELETE then removed. What serialises with the
-- platform's admission and with a forced clear is the scope's advisory lock, so the guard takes it,
-- decides and writes the record; admission (runtime_cleanup_blocked) and force-clear honour that
-- record until T or until the release reports its answer.
--
-- PL/pgSQL, VOLATILE, READ COMMITTED (runtime_cleanup_require_read_committed): each statement after
-- pg_advisory_xact_lock takes a fresh snapshot, so it reads what was committed by whoever held the
-- lock before (a platform admission, a forced clear). A single SQL statement could not: its
-- snapshot is taken when it starts, before the lock is granted.
--
-- Verdicts, in the order they are decided:
--   run_not_found     no such run
--   scope_mismatch    the command's uid or scope is not the run's        (forged or mismatched)
--   run_not_root      the run is a subagent run                          (forged or mismatched)
--   run_not_terminal  the run is not in a terminal status                (forged or mismatched)
--   fence_gone        the fence is down, or was raised anew since phase 1  (stale: skip)
--   scope_active      an active run in the scope or below the run        (restart at phase 1)
--   sandbox_mismatch  the scope's sandbox row does not name exactly this sandbox id and generation
--   already_released  that generation was already confirmed gone         (stale: restart at phase 1)
--   proceed           the delete may be sent; the in-flight record is set
--
-- p_fence_set_at is compared as an instant (phase 1 renders it as ISO 8601 with its offset).
-- p_hold_seconds: how long the delete may still act at the provisioner, from now (the caller's
-- whole release bound plus the provisioner's own delete time plus a margin). An earlier attempt's
-- record that is still live is kept as a floor: the new deadline is never earlier than it. A live
-- record that carries p_token is this very attempt, committed once already (the client repeats the
-- whole transaction when the connection is lost, and a lost answer to a COMMIT that did happen
-- looks just the same): it is no floor, since taking it for one kept the scope quarantined for the
-- whole hold after the provisioner had answered.
-- p_lock_timeout_ms: local to this statement's transaction; a lock held too long fails the attempt
-- (retried with backoff) instead of waiting without bound.
CREATE OR REPLACE FUNCTION runtime_cleanup_begin_release(
  p_run_id text,
  p_uid text,
  p_runtime_scope_id text,
  p_sandbox_id text,
  p_generation bigint,
  p_fence_set_at text,
  p_hold_seconds double precision,
  p_token text,
  p_lock_timeout_ms integer
) RETURNS TABLE (verdict text, blocking_run_id text, in_flight_until timestamptz, floor_until timestamptz)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    run record;
    sandbox record;
    active_id text;
    previous_until timestamptz;
    new_until timestamptz;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(p_uid, p_runtime_scope_id));

    SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
           r.runtime_cleanup_pending_since AS fence_set_at
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF run.uid IS DISTINCT FROM p_uid OR run.runtime_scope_id IS DISTINCT FROM p_runtime_scope_id THEN
      RETURN QUERY SELECT 'scope_mismatch'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF run.run_type = 'subagent' THEN
      RETURN QUERY SELECT 'run_not_root'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      RETURN QUERY SELECT 'run_not_terminal'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF run.runtime_cleanup_pending IS NOT TRUE OR run.fence_set_at IS DISTINCT FROM p_fence_set_at::timestamptz THEN
      RETURN QUERY SELECT 'fence_gone'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    active_id := runtime_cleanup_active_run(p_uid, p_runtime_scope_id, p_run_id);
    IF active_id IS NOT NULL THEN
      RETURN QUERY SELECT 'scope_active'::text, active_id, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    SELECT s.sandbox_id, s.generation, s.delete_in_flight_until, s.delete_in_flight_token,
           runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                               s.sandbox_id, s.generation) AS released
      INTO sandbox
      FROM sandbox_runtimes s
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
      FOR UPDATE;
    IF NOT FOUND OR sandbox.sandbox_id IS DISTINCT FROM p_sandbox_id OR sandbox.generation IS DISTINCT FROM p_generation THEN
      RETURN QUERY SELECT 'sandbox_mismatch'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF sandbox.released THEN
      RETURN QUERY SELECT 'already_released'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    previous_until := CASE WHEN sandbox.delete_in_flight_until > clock_timestamp()
                                AND sandbox.delete_in_flight_token IS DISTINCT FROM p_token
                           THEN sandbox.delete_in_flight_until END;
    new_until := greatest(clock_timestamp() + make_interval(secs => p_hold_seconds), previous_until);
    UPDATE sandbox_runtimes s
      SET delete_in_flight_until = new_until,
          delete_in_flight_token = p_token,
          delete_in_flight_run_id = p_run_id,
          delete_in_flight_sandbox_id = p_sandbox_id,
          delete_in_flight_generation = p_generation
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id;
    RETURN QUERY SELECT 'proceed'::text, NULL::text, new_until, previous_until;
  END
  $$;
