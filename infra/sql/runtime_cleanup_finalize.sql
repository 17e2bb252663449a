-- Phase 3, finalize, after a confirmed delete (or when there was nothing to delete): ONE call in a
-- one-round-trip transaction, as phase 1. Clears the fence and marks the captured generation
-- released only if nothing the delete relied on moved. Decisions:
--   run_not_found     no such run
--   already_clear     the fence is down (a concurrent finalize, a forced clear)
--   identity_changed  `changed` says what: scope, fence, workdir, sandbox, generation (restart)
--   run_not_terminal  the run itself is not terminal any more                   (defer)
--   scope_active      an active run in the scope or below the run               (defer)
--   delete_in_flight  a delete may still act on the scope's sandbox             (defer)
--   cleared           fence cleared, generation marked released, at `cleaned_at`
--
-- No "cleaned" while a delete may still be in flight (review finding F9): finalize used to clear
-- the fence (and the caller to publish runtime-cleaned) while the scope's delete-in-flight record
-- was still live, so a consumer admitting on that event saw the scope blocked. It defers instead
-- until the record has ended, and answers delete_in_flight instead of already_clear too: the caller
-- announces "cleaned" on both, and must not while the scope still reads as blocked.
--
-- The release mark names its generation (released_sandbox_id, released_generation, written
-- together with released_at): see runtime_cleanup_generation_released.
CREATE OR REPLACE FUNCTION runtime_cleanup_finalize(
  p_run_id text,
  p_uid text,
  p_runtime_scope_id text,
  p_workdir_path text,
  p_sandbox_id text,
  p_generation bigint,
  p_fence_set_at text
) RETURNS TABLE (decision text, blocking_run_id text, changed text[], cleaned_at text)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    run record;
    conv record;
    sandbox record;
    live boolean;
    in_flight boolean;
    active_id text;
    moved text[] := ARRAY[]::text[];
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(p_uid, p_runtime_scope_id));
    SELECT r.uid, r.runtime_scope_id, r.status, r.runtime_cleanup_pending,
           r.runtime_cleanup_pending_since AS fence_set_at, r.conversation_id, r.conversation_thread_id
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id
      FOR UPDATE;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::text[], NULL::text;
      RETURN;
    END IF;

    -- The scope's sandbox row, locked: the write below may mark it, and its in-flight record is
    -- read as committed by the release that last held the scope's lock.
    SELECT s.sandbox_id, s.generation, s.delete_in_flight_run_id,
           runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                               s.sandbox_id, s.generation) AS released,
           coalesce(s.delete_in_flight_until > clock_timestamp(), false) AS in_flight
      INTO sandbox
      FROM sandbox_runtimes s
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
      FOR UPDATE;
    live := FOUND AND NOT sandbox.released;
    in_flight := FOUND AND sandbox.in_flight;

    IF run.runtime_cleanup_pending IS NOT TRUE THEN
      IF in_flight THEN
        RETURN QUERY SELECT 'delete_in_flight'::text, sandbox.delete_in_flight_run_id, NULL::text[], NULL::text;
      ELSE
        RETURN QUERY SELECT 'already_clear'::text, NULL::text, NULL::text[], NULL::text;
      END IF;
      RETURN;
    END IF;

    IF run.uid IS DISTINCT FROM p_uid OR run.runtime_scope_id IS DISTINCT FROM p_runtime_scope_id THEN
      moved := moved || 'scope'::text;
    END IF;
    -- Compared as instants: the text was rendered by phase 1 (ISO 8601 with offset, or by an
    -- older version in its session's format); either parses back to the same instant.
    IF run.fence_set_at IS DISTINCT FROM p_fence_set_at::timestamptz THEN
      moved := moved || 'fence'::text;
    END IF;
    IF cardinality(moved) > 0 THEN
      RETURN QUERY SELECT 'identity_changed'::text, NULL::text, moved, NULL::text;
      RETURN;
    END IF;

    IF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      RETURN QUERY SELECT 'run_not_terminal'::text, p_run_id, NULL::text[], NULL::text;
      RETURN;
    END IF;
    active_id := runtime_cleanup_active_run(p_uid, p_runtime_scope_id, p_run_id);
    IF active_id IS NOT NULL THEN
      RETURN QUERY SELECT 'scope_active'::text, active_id, NULL::text[], NULL::text;
      RETURN;
    END IF;

    SELECT c.uid, c.workdir_path INTO conv FROM conversations c
      WHERE c.id = run.conversation_id OR (run.conversation_id IS NULL AND c.thread_id = run.conversation_thread_id)
      LIMIT 1;
    IF conv.workdir_path IS DISTINCT FROM p_workdir_path OR conv.uid IS DISTINCT FROM p_uid THEN
      moved := moved || 'workdir'::text;
    END IF;
    -- The live sandbox is named by its id *and* its generation: the provisioner counts generations
    -- per sandbox id, so a sandbox re-created under another id can carry the very same number.
    IF live AND sandbox.sandbox_id IS DISTINCT FROM p_sandbox_id THEN
      moved := moved || 'sandbox'::text;
    ELSIF live AND sandbox.generation IS DISTINCT FROM p_generation THEN
      moved := moved || 'generation'::text;
    END IF;
    IF cardinality(moved) > 0 THEN
      RETURN QUERY SELECT 'identity_changed'::text, NULL::text, moved, NULL::text;
      RETURN;
    END IF;

    IF in_flight THEN
      RETURN QUERY SELECT 'delete_in_flight'::text, sandbox.delete_in_flight_run_id, NULL::text[], NULL::text;
      RETURN;
    END IF;

    UPDATE agent_runs SET runtime_cleanup_pending = false, updated_at = now()
      WHERE id = p_run_id AND runtime_cleanup_pending;
    UPDATE sandbox_runtimes s
      SET released_at = now(), released_sandbox_id = s.sandbox_id, released_generation = s.generation
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
        AND s.sandbox_id = p_sandbox_id AND s.generation = p_generation
        AND NOT runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                                    s.sandbox_id, s.generation);
    RETURN QUERY SELECT 'cleared'::text, NULL::text, NULL::text[], to_json(now()) #>> '{}';
  END
  $$;
