-- Phase 1, the fence check: ONE call, in a one-round-trip transaction (the client sends BEGIN,
-- the SET LOCAL bounds, this call and COMMIT in one simple-query message), that locks, reads and
-- decides, and returns the decision with the identity phase 2 deletes and phase 3 re-checks. The
-- locks are therefore never held while anything travels between the function instance and the
-- database (issue 15: they used to be held across two or three round trips, each waiting its turn
-- on a busy event loop). functions/cleanup/fence-check.ts only maps the decision onto outcomes.
--
-- Decisions, in the order they are taken:
--   run_not_found              no such run
--   not_owner                  a subagent run never owns a cleanup
--   already_clean              the fence is down
--   run_not_terminal           the run itself is not terminal                    (defer)
--   scope_active               an active run in the scope or below the run       (defer)
--   conversation_missing       the run's conversation row does not exist         (refuse)
--   conversation_uid_mismatch  the conversation belongs to another uid           (refuse)
--   release_needed             the scope has a live generation: delete it
--   nothing_to_delete          no live generation: finalize directly
-- The identity columns are filled for the last two.
--
-- The fence's identity (fence_set_at) is emitted as ISO 8601 with its offset
-- (`to_json(ts) #>> '{}'`): rendered with `::text` it depended on the reading session's TimeZone
-- and DateStyle, so a session configured otherwise (an operator's `ALTER DATABASE … SET timezone`,
-- a pooled server connection on which another client ran `SET TimeZone`) read the same fence as
-- "changed". The later phases compare it as timestamptz.
CREATE OR REPLACE FUNCTION runtime_cleanup_fence_check(p_run_id text)
  RETURNS TABLE (decision text, uid text, runtime_scope_id text, workdir_path text, sandbox_id text,
                 generation bigint, fence_set_at text, blocking_run_id text)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    run record;
    conv record;
    sandbox record;
    active_id text;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    IF NOT runtime_cleanup_lock_run(p_run_id) THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
           to_json(r.runtime_cleanup_pending_since) #>> '{}' AS fence_set_at, r.conversation_id, r.conversation_thread_id
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id;

    IF run.run_type = 'subagent' THEN
      RETURN QUERY SELECT 'not_owner'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    IF run.runtime_cleanup_pending IS NOT TRUE THEN
      RETURN QUERY SELECT 'already_clean'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    IF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      RETURN QUERY SELECT 'run_not_terminal'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, p_run_id;
      RETURN;
    END IF;
    active_id := runtime_cleanup_active_run(run.uid, run.runtime_scope_id, p_run_id);
    IF active_id IS NOT NULL THEN
      RETURN QUERY SELECT 'scope_active'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, active_id;
      RETURN;
    END IF;

    SELECT c.uid, c.workdir_path INTO conv FROM conversations c
      WHERE c.id = run.conversation_id OR (run.conversation_id IS NULL AND c.thread_id = run.conversation_thread_id)
      LIMIT 1;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'conversation_missing'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    IF conv.uid IS DISTINCT FROM run.uid THEN
      RETURN QUERY SELECT 'conversation_uid_mismatch'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;

    SELECT s.sandbox_id, s.generation INTO sandbox FROM sandbox_runtimes s
      WHERE s.uid = run.uid AND s.runtime_scope_id = run.runtime_scope_id
        AND NOT runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                                    s.sandbox_id, s.generation);
    IF FOUND THEN
      RETURN QUERY SELECT 'release_needed'::text, run.uid, run.runtime_scope_id, conv.workdir_path,
                          sandbox.sandbox_id, sandbox.generation, run.fence_set_at, NULL::text;
    ELSE
      RETURN QUERY SELECT 'nothing_to_delete'::text, run.uid, run.runtime_scope_id, conv.workdir_path,
                          NULL::text, NULL::bigint, run.fence_set_at, NULL::text;
    END IF;
  END
  $$;
