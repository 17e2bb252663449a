-- An operator's forced clear of a fence (`npm run ops -- force-clear`), a decision function of the
-- same shape as the phases: ONE call in a one-round-trip transaction that locks, reads, decides
-- and, when told to apply, clears this run's fence and writes its audit row
-- (runtime_cleanup_overrides) together, so a forced clear can never be silent.
-- functions/cleanup/force-clear.ts only validates the operator's text and maps the verdicts onto
-- its errors and results.
--
-- It skips the confirmed delete and nothing else: the same locks as phase 1
-- (runtime_cleanup_lock_run), the same re-checks (a terminal root run, its fence up, no active run
-- in the scope or below it: runtime_cleanup_active_run), and no delete that may still be in flight
-- for the scope: the platform would then admit a new run, the provisioner hand it the still-live
-- sandbox, and the late DELETE remove it under the running run. The sandbox row is read FOR UPDATE,
-- so a guard that committed a record just before is seen, and one still writing is waited for.
--
-- It does NOT mark the scope's generation released: nothing confirmed it gone, and "released" is
-- what lets a cleanup skip the delete (another fenced run of the scope would then have been cleared
-- as "nothing to delete" without an audit row of its own, and the sandbox left running). The
-- generation stays live; the next cleanup of the scope deletes it. The plan names it (sandbox_id,
-- generation: the live generation by runtime_cleanup_generation_released, else NULL) because it
-- may still exist at the provisioner.
--
-- Verdicts, in the order they are decided (nothing is written unless the last is `cleared`):
--   run_not_found      no such run
--   run_not_root       a subagent run owns no fence
--   fence_not_pending  the fence is down: nothing to clear
--   run_not_terminal   the run is not terminal: its sandbox is in use
--   scope_active       active_run_id is active in the scope or below the run
--   delete_in_flight   a DELETE may still act until delete_in_flight_until (the record's fields)
--   would_clear        p_apply is false (a dry run): the plan, nothing changed
--   cleared            fence cleared and audited: override_id, forced_at
--
-- A late message of the cleared fence stays harmless: a stale release finds its fence gone in the
-- guard and sends nothing; a stale finalize finds the fence clear. Repeated after a lost answer to
-- a COMMIT that happened, the call answers fence_not_pending; the CLI recognises its own audit row
-- (infra/ops/forced-clears.ts).
CREATE OR REPLACE FUNCTION runtime_cleanup_force_clear(
  p_run_id text,
  p_reason text,
  p_actor text,
  p_apply boolean
) RETURNS TABLE (verdict text, uid text, runtime_scope_id text, status text, fence_set_at text,
                 sandbox_id text, generation bigint, active_run_id text,
                 delete_in_flight_until text, delete_in_flight_run_id text,
                 delete_in_flight_sandbox_id text, delete_in_flight_generation bigint,
                 override_id bigint, forced_at text)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    run record;
    sandbox record;
    active_id text;
    live_sandbox_id text;
    live_generation bigint;
    audit record;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    IF NOT runtime_cleanup_lock_run(p_run_id) THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::bigint, NULL::text;
      RETURN;
    END IF;
    SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
           r.runtime_cleanup_pending_since, to_json(r.runtime_cleanup_pending_since) #>> '{}' AS fence_set_at
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id;

    IF run.run_type = 'subagent' THEN
      verdict := 'run_not_root';
    ELSIF run.runtime_cleanup_pending IS NOT TRUE THEN
      verdict := 'fence_not_pending';
    ELSIF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      verdict := 'run_not_terminal';
    ELSE
      active_id := runtime_cleanup_active_run(run.uid, run.runtime_scope_id, p_run_id);
      IF active_id IS NOT NULL THEN
        verdict := 'scope_active';
      END IF;
    END IF;
    IF verdict IS NOT NULL THEN
      RETURN QUERY SELECT verdict, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                          NULL::text, NULL::bigint, active_id, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::bigint, NULL::text;
      RETURN;
    END IF;

    SELECT s.sandbox_id, s.generation,
           runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                               s.sandbox_id, s.generation) AS released,
           coalesce(s.delete_in_flight_until > clock_timestamp(), false) AS in_flight,
           to_json(s.delete_in_flight_until) #>> '{}' AS in_flight_until,
           s.delete_in_flight_run_id, s.delete_in_flight_sandbox_id, s.delete_in_flight_generation
      INTO sandbox
      FROM sandbox_runtimes s
      WHERE s.uid = run.uid AND s.runtime_scope_id = run.runtime_scope_id
      FOR UPDATE;
    IF FOUND AND sandbox.in_flight THEN
      RETURN QUERY SELECT 'delete_in_flight'::text, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                          NULL::text, NULL::bigint, NULL::text, sandbox.in_flight_until,
                          sandbox.delete_in_flight_run_id, sandbox.delete_in_flight_sandbox_id,
                          sandbox.delete_in_flight_generation, NULL::bigint, NULL::text;
      RETURN;
    END IF;
    IF FOUND AND NOT sandbox.released THEN
      live_sandbox_id := sandbox.sandbox_id;
      live_generation := sandbox.generation;
    END IF;

    IF NOT p_apply THEN
      RETURN QUERY SELECT 'would_clear'::text, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                          live_sandbox_id, live_generation, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::bigint, NULL::text;
      RETURN;
    END IF;

    -- The row lock held since runtime_cleanup_lock_run keeps the fence up until here.
    UPDATE agent_runs r SET runtime_cleanup_pending = false, updated_at = now()
      WHERE r.id = p_run_id AND r.runtime_cleanup_pending;
    INSERT INTO runtime_cleanup_overrides AS o
        (run_id, uid, runtime_scope_id, sandbox_id, generation, fence_set_at, reason, actor)
      VALUES (p_run_id, run.uid, run.runtime_scope_id, live_sandbox_id, live_generation,
              run.runtime_cleanup_pending_since, p_reason, p_actor)
      RETURNING o.id, to_json(o.forced_at) #>> '{}' AS forced_at INTO audit;
    RETURN QUERY SELECT 'cleared'::text, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                        live_sandbox_id, live_generation, NULL::text, NULL::text, NULL::text, NULL::text,
                        NULL::bigint, audit.id, audit.forced_at;
  END
  $$;
