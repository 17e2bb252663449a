-- 010: the decision functions note when they took the scope's lock.
--
-- Issue 15 holds phase 1, the release guard and phase 3 to one round trip under the lock, and asks
-- for the advisory-lock hold itself (p99 < 5 ms). A client can only time the whole message, which
-- adds the trip back and its own event-loop delay after the locks are gone, and the server's time
-- on the message includes any wait for the lock behind another holder. So each decision function
-- now records, in a transaction-local setting, the moment it first took the scope's advisory lock
-- (`runtime_cleanup.lock_taken_at`, epoch seconds); a caller that wants the hold reads it before
-- COMMIT and the clock after COMMIT in the same message (`Database.transact` does when observed).
--
-- Nothing else changes: the three bodies below are 008's (begin_release: 004's as 008 left it),
-- re-stated whole because PL/pgSQL has no other way to add a line, with one call added right after
-- each `pg_advisory_xact_lock`. SET LOCAL semantics (set_config(..., true)): nothing outlives the
-- transaction, behind a transaction-mode pooler too. Cost: one set_config per decision.

CREATE OR REPLACE FUNCTION runtime_cleanup_note_lock_taken() RETURNS void
  LANGUAGE plpgsql VOLATILE
  AS $$
  BEGIN
    -- The first lock of the transaction starts the hold (fence_check may follow a moved run to a
    -- second scope; the first lock is still held then).
    IF coalesce(current_setting('runtime_cleanup.lock_taken_at', true), '') = '' THEN
      PERFORM set_config('runtime_cleanup.lock_taken_at', extract(epoch FROM clock_timestamp())::text, true);
    END IF;
  END;
  $$;

CREATE OR REPLACE FUNCTION runtime_cleanup_fence_check(p_run_id text)
 RETURNS TABLE(decision text, uid text, runtime_scope_id text, workdir_path text, sandbox_id text, generation bigint, fence_set_at text, blocking_run_id text)
 LANGUAGE plpgsql
AS $function$
  DECLARE
    terminal constant text[] := ARRAY['completed', 'failed', 'cancelled', 'interrupted'];
    locked_uid text;
    locked_scope text;
    run record;
    conv record;
    sandbox record;
    active_id text;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    -- The scope is only known from the row: read it, lock it, then lock and re-read the row. A row
    -- that moved to another scope meanwhile is followed (both locks are then held until commit).
    SELECT r.uid, r.runtime_scope_id INTO locked_uid, locked_scope FROM agent_runs r WHERE r.id = p_run_id;
    LOOP
      IF locked_uid IS NULL THEN
        RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::text, NULL::text, NULL::text,
                            NULL::bigint, NULL::text, NULL::text;
        RETURN;
      END IF;
      PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(locked_uid, locked_scope));
      PERFORM runtime_cleanup_note_lock_taken();
      SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
             to_json(r.runtime_cleanup_pending_since) #>> '{}' AS fence_set_at, r.conversation_id, r.conversation_thread_id
        INTO run
        FROM agent_runs r WHERE r.id = p_run_id
        FOR UPDATE;
      IF NOT FOUND THEN
        locked_uid := NULL;
      ELSIF run.uid = locked_uid AND run.runtime_scope_id = locked_scope THEN
        EXIT;
      ELSE
        locked_uid := run.uid;
        locked_scope := run.runtime_scope_id;
      END IF;
    END LOOP;

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
    IF run.status IS NULL OR NOT (run.status = ANY (terminal)) THEN
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
  $function$;

CREATE OR REPLACE FUNCTION runtime_cleanup_begin_release(p_run_id text, p_uid text, p_runtime_scope_id text, p_sandbox_id text, p_generation bigint, p_fence_set_at text, p_hold_seconds double precision, p_token text, p_lock_timeout_ms integer)
 RETURNS TABLE(verdict text, blocking_run_id text, in_flight_until timestamp with time zone, floor_until timestamp with time zone)
 LANGUAGE plpgsql
AS $function$
  DECLARE
    terminal constant text[] := ARRAY['completed', 'failed', 'cancelled', 'interrupted'];
    run record;
    sandbox record;
    active_id text;
    previous_until timestamptz;
    new_until timestamptz;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(p_uid, p_runtime_scope_id));
    PERFORM runtime_cleanup_note_lock_taken();

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
    IF run.status IS NULL OR NOT (run.status = ANY (terminal)) THEN
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
  $function$;

CREATE OR REPLACE FUNCTION runtime_cleanup_finalize(p_run_id text, p_uid text, p_runtime_scope_id text, p_workdir_path text, p_sandbox_id text, p_generation bigint, p_fence_set_at text)
 RETURNS TABLE(decision text, blocking_run_id text, changed text[], cleaned_at text)
 LANGUAGE plpgsql
AS $function$
  DECLARE
    terminal constant text[] := ARRAY['completed', 'failed', 'cancelled', 'interrupted'];
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
    PERFORM runtime_cleanup_note_lock_taken();
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

    IF run.status IS NULL OR NOT (run.status = ANY (terminal)) THEN
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
  $function$;
