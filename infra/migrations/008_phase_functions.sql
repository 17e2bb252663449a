-- Phase 1 and phase 3 decide inside PostgreSQL (issue 15), the release mark is bound to the
-- generation it released, and every decision refuses to run on a snapshot older than its locks.
--
-- 1. One round trip under the lock. Phase 1 (fence check) and phase 3 (finalize) used to take the
--    scope's advisory lock and the run's row lock in one statement and decide in the next ones,
--    so the locks were held across two or three round trips, each waiting its turn on a busy
--    event loop. Each phase is now ONE function call that locks, reads and decides (and, for
--    finalize, writes) in the database and returns the decision and the identity, as
--    graphile-worker's get_job does. The client sends BEGIN, the SET LOCALs, the call and COMMIT
--    in one simple-query message, so the locks are never held while anything travels.
--    The decision logic lives here, in one place; functions/cleanup/{fence-check,finalize}.ts
--    only map the decision onto the outcome types.
--
-- 2. READ COMMITTED, enforced (review finding F19). Each decision reads what was committed by
--    whoever held the scope's lock before it. plpgsql gives each statement of a VOLATILE function
--    a fresh snapshot only under READ COMMITTED: under REPEATABLE READ or SERIALIZABLE the whole
--    function would decide on the snapshot taken when the call began, before the lock was
--    granted. A database or role with `default_transaction_isolation = 'repeatable read'` would
--    silently break the guard, so every decision function refuses any other level.
--
-- 3. The release mark names its generation (review finding F3). `released_at` alone was trusted:
--    a platform write that bypasses the trigger of 005 (`ALTER TABLE … DISABLE TRIGGER`, a restore
--    under `session_replication_role = replica`) could record a new generation under a row that
--    still carried the old `released_at`, and the live new sandbox then looked released: phase 1
--    said "nothing to delete" and finalize cleared the fence over it. A generation now counts as
--    released only when `released_sandbox_id` and `released_generation` name the row's current
--    sandbox id and generation; finalize writes all three together.
--
-- 4. No "cleaned" while a delete may still be in flight (review finding F9). Finalize used to
--    clear the fence (and the caller to publish runtime-cleaned) while the scope's
--    delete-in-flight record (004) was still live, so a consumer admitting on that event saw the
--    scope blocked. Finalize now defers (reason delete_in_flight) until the record has ended.
--
-- 5. The fence's identity is an instant, not a text. `runtime_cleanup_pending_since` travels
--    between the phases in the messages; rendered with `::text` it depended on the reading
--    session's TimeZone and DateStyle, so a session configured otherwise (an operator's
--    `ALTER DATABASE … SET timezone`, a pooled server connection on which another client ran
--    `SET TimeZone`) read the same fence as "changed". It is now emitted as ISO 8601 with its
--    offset (`to_json(ts) #>> '{}'`, independent of both settings) and compared as timestamptz.
--
-- 6. NULLs in an adopted platform table (001 adopts an existing `agent_runs` as it is). The
--    decisions rely on the contract's NOT NULL columns; a NULL `status` read through
--    `status NOT IN (…)` or `NOT (status = ANY (…))` is neither active nor non-terminal, so a run
--    whose status was not written yet counted as finished. The contract's NOT NULLs are enforced
--    below (refusing, with the offending column named, a table holding NULLs), and every
--    predicate is written so that a NULL status counts as active all the same (a constraint can
--    be dropped again later). A NULL `runtime_cleanup_pending` reads as "no fence", as in
--    `runtime_cleanup_blocked` and the fence indexes of 006.

DO $$
DECLARE
  col text;
  nulls bigint;
BEGIN
  FOREACH col IN ARRAY ARRAY['uid', 'runtime_scope_id', 'run_type', 'status', 'runtime_cleanup_pending'] LOOP
    IF EXISTS (SELECT 1 FROM information_schema.columns c
               WHERE c.table_schema = current_schema() AND c.table_name = 'agent_runs'
                 AND c.column_name = col AND c.is_nullable = 'YES') THEN
      EXECUTE format('SELECT count(*) FROM agent_runs WHERE %I IS NULL', col) INTO nulls;
      IF nulls > 0 THEN
        RAISE EXCEPTION 'agent_runs.% is NULL in % row(s); the runtime cleanup contract requires it NOT NULL', col, nulls
          USING ERRCODE = 'not_null_violation',
                HINT = 'Fill the column in those rows (a run without a status is not finished), then apply the migration again.';
      END IF;
      EXECUTE format('ALTER TABLE agent_runs ALTER COLUMN %I SET NOT NULL', col);
    END IF;
  END LOOP;
END
$$;

-- Runs whose status is NULL, should the NOT NULL above be dropped again: a NULL status counts as
-- active, and this (normally empty) index lets the scope lookup of runtime_cleanup_active_run
-- find them beside agent_runs_active_by_scope (a BitmapOr of the two) instead of scanning.
CREATE INDEX IF NOT EXISTS agent_runs_null_status_by_scope ON agent_runs (uid, runtime_scope_id)
  WHERE status IS NULL;

ALTER TABLE sandbox_runtimes
  ADD COLUMN IF NOT EXISTS released_sandbox_id text,
  ADD COLUMN IF NOT EXISTS released_generation bigint;

-- No backfill: a mark made before this migration names no generation, so it counts as "not
-- released". Copying the row's current (sandbox_id, generation) into it would certify exactly the
-- stale marks described above (a generation recorded under an old released_at by a write that
-- bypassed the 005 trigger before this migration ran) as released. The cost of not backfilling
-- is one idempotent DELETE, answered 404, for each such scope at its next cleanup.

-- True when the row's current (sandbox_id, generation) was confirmed gone.
CREATE OR REPLACE FUNCTION runtime_cleanup_generation_released(
  released_at timestamptz, released_sandbox_id text, released_generation bigint,
  sandbox_id text, generation bigint
) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$
    SELECT released_at IS NOT NULL
       AND released_sandbox_id IS NOT DISTINCT FROM sandbox_id
       AND released_generation IS NOT DISTINCT FROM generation
  $$;

-- Raised by every decision function when the transaction is not READ COMMITTED.
CREATE OR REPLACE FUNCTION runtime_cleanup_require_read_committed() RETURNS void
  LANGUAGE plpgsql VOLATILE
  AS $$
  BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION 'runtime cleanup decisions need READ COMMITTED; this transaction is %',
          upper(current_setting('transaction_isolation'))
        USING ERRCODE = 'invalid_transaction_state',
              HINT = 'Begin the transaction with BEGIN ISOLATION LEVEL READ COMMITTED: under a higher level a decision would read a snapshot taken before its locks were granted.';
    END IF;
  END
  $$;

-- The first non-terminal run, other than p_run_id, in the scope or below p_run_id (a subagent
-- run may live in another scope). Anything that is not a known terminal status counts as active,
-- NULL included. The statuses are spelled out so the partial index agent_runs_active_by_scope
-- applies (with agent_runs_null_status_by_scope for the NULL arm).
CREATE OR REPLACE FUNCTION runtime_cleanup_active_run(p_uid text, p_runtime_scope_id text, p_run_id text)
  RETURNS text
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    active_id text;
  BEGIN
    SELECT a.id INTO active_id FROM agent_runs a
      WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id AND a.id <> p_run_id
        AND (a.status NOT IN ('completed', 'failed', 'cancelled', 'interrupted') OR a.status IS NULL)
      ORDER BY a.id LIMIT 1;
    IF active_id IS NULL THEN
      WITH RECURSIVE descendants AS (
        SELECT a.id, a.status FROM agent_runs a WHERE a.created_by_run_id = p_run_id
        UNION
        SELECT a.id, a.status FROM agent_runs a JOIN descendants d ON a.created_by_run_id = d.id
      )
      SELECT d.id INTO active_id FROM descendants d
        WHERE d.status NOT IN ('completed', 'failed', 'cancelled', 'interrupted') OR d.status IS NULL
        ORDER BY d.id LIMIT 1;
    END IF;
    RETURN active_id;
  END
  $$;

-- Phase 1. Decisions, in the order they are taken:
--   run_not_found              no such run
--   not_owner                  a subagent run never owns a cleanup
--   already_clean              the fence is down
--   run_not_terminal           the run itself is not terminal                    (defer)
--   scope_active               a non-terminal run in the scope or below the run  (defer)
--   conversation_missing       the run's conversation row does not exist         (refuse)
--   conversation_uid_mismatch  the conversation belongs to another uid           (refuse)
--   release_needed             the scope has a live generation: delete it
--   nothing_to_delete          no live generation: finalize directly
-- The identity columns are filled for the last two.
CREATE OR REPLACE FUNCTION runtime_cleanup_fence_check(p_run_id text)
  RETURNS TABLE (decision text, uid text, runtime_scope_id text, workdir_path text, sandbox_id text,
                 generation bigint, fence_set_at text, blocking_run_id text)
  LANGUAGE plpgsql VOLATILE
  AS $$
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
  $$;

-- Phase 3, after a confirmed delete (or when there was nothing to delete). Clears the fence and
-- marks the captured generation released only if nothing the delete relied on moved. Decisions:
--   run_not_found     no such run
--   already_clear     the fence is down (a concurrent finalize, a forced clear)
--   identity_changed  `changed` says what: scope, fence, workdir, sandbox, generation (restart)
--   run_not_terminal  the run itself is not terminal any more                   (defer)
--   scope_active      a non-terminal run in the scope or below the run          (defer)
--   delete_in_flight  a delete may still act on the scope's sandbox (004)       (defer)
--   cleared           fence cleared, generation marked released, at `cleaned_at`
-- delete_in_flight is also answered instead of already_clear: the caller announces "cleaned" on
-- both, and must not while the scope still reads as blocked.
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
  $$;

-- The release guard of 004, now refusing any isolation but READ COMMITTED, reading a generation
-- as released only when the mark names it, comparing the fence as an instant, counting a NULL
-- status as active, and recognising its own record. A live in-flight record that carries p_token
-- is this very attempt, committed once already: the client repeats the whole transaction when
-- the connection is lost, and a lost answer to a COMMIT that did happen looks just the same. It
-- is not an earlier attempt's delete, so it is no floor: taking it for one kept the scope
-- quarantined for the whole hold after the provisioner had answered.
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
  $$;
