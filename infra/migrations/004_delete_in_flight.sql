-- The release guard, bound to the sandbox it deletes, and the quarantine of a scope while a
-- delete may still be in flight (issue 11, items 1 and 2).
--
-- Why a plain read before the DELETE was not enough: a read says what was true when it ran, and
-- nothing kept the scope from reopening between that read and the DELETE. An operator's forced
-- clear could drop the fence meanwhile, the platform then admitted a new run, and the provisioner
-- (which reuses a live container on POST, and whose DELETE ignores the generation) handed that run
-- the very sandbox the late DELETE then removed. What serialises with the platform's admission and
-- with a forced clear is the scope's advisory lock, so the guard takes it, decides, and records
-- "a delete is in flight until T" on the scope's sandbox row, all in one statement; admission
-- (`runtime_cleanup_blocked`) and force-clear honour that record until T or until the release
-- reports its answer. The lock lasts for that one statement only, never across the DELETE.
--
-- All new columns are nullable: a row written with only the contract's columns stays valid.
--
-- delete_in_flight_until: no run may be admitted to the scope before this time (NULL: no delete
--   in flight). Set by runtime_cleanup_begin_release to the longest a delete it lets through can
--   still act at the provisioner; lowered by the release itself once the provisioner answered.
-- delete_in_flight_token: the release attempt that set it; a release clears only its own record.
-- delete_in_flight_run_id / _sandbox_id / _generation: what the delete is for (operators read them).
ALTER TABLE sandbox_runtimes
  ADD COLUMN IF NOT EXISTS delete_in_flight_until timestamptz,
  ADD COLUMN IF NOT EXISTS delete_in_flight_token text,
  ADD COLUMN IF NOT EXISTS delete_in_flight_run_id text,
  ADD COLUMN IF NOT EXISTS delete_in_flight_sandbox_id text,
  ADD COLUMN IF NOT EXISTS delete_in_flight_generation bigint;

-- Admission checks this under the scope's advisory lock. True while any root run of the scope
-- still has its fence up, or while a delete may still be in flight for the scope's sandbox (a
-- forced clear can drop the fence before the provisioner has answered that delete).
--
-- now() is the caller's transaction start: comparing the deadline with an earlier time can only
-- keep the scope blocked a little longer, never admit early.
CREATE OR REPLACE FUNCTION runtime_cleanup_blocked(uid text, runtime_scope_id text) RETURNS boolean
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT EXISTS (
      SELECT 1 FROM agent_runs r
      WHERE r.uid = runtime_cleanup_blocked.uid
        AND r.runtime_scope_id = runtime_cleanup_blocked.runtime_scope_id
        AND r.run_type <> 'subagent'
        AND r.runtime_cleanup_pending
    ) OR EXISTS (
      SELECT 1 FROM sandbox_runtimes s
      WHERE s.uid = runtime_cleanup_blocked.uid
        AND s.runtime_scope_id = runtime_cleanup_blocked.runtime_scope_id
        AND s.delete_in_flight_until > now()
    )
  $$;

-- The release guard: one decision under the scope's advisory lock, returning a verdict.
--
-- plpgsql, VOLATILE: under READ COMMITTED each statement below takes a fresh snapshot, so what it
-- reads after pg_advisory_xact_lock is what was committed by whoever held the lock before
-- (a platform admission, a forced clear). A single SQL statement could not do this: its snapshot
-- is taken when it starts, before the lock is granted.
--
-- Called as one autocommit statement: the lock is released when the statement ends, before the
-- caller sends anything to the provisioner.
--
-- Verdicts, in the order they are decided:
--   run_not_found     no such run
--   scope_mismatch    the command's uid or scope is not the run's        (forged or mismatched)
--   run_not_root      the run is a subagent run                          (forged or mismatched)
--   run_not_terminal  the run is not in a terminal status                (forged or mismatched)
--   fence_gone        the fence is down, or was raised anew since phase 1  (stale: skip)
--   scope_active      a non-terminal run in the scope or below the run     (restart at phase 1)
--   sandbox_mismatch  the scope's sandbox row does not name exactly this sandbox id and generation
--   already_released  that generation was already confirmed gone         (stale: restart at phase 1)
--   proceed           the delete may be sent; the in-flight record is set
--
-- p_hold_seconds: how long the delete may still act at the provisioner, from now (the caller's
-- whole release bound plus the provisioner's own delete time plus a margin). An earlier attempt's
-- record that is still live is kept as a floor: the new deadline is never earlier than it.
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
    -- Local to this statement's transaction: a lock held too long fails the attempt (retried with
    -- backoff) instead of waiting without bound.
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(p_uid, p_runtime_scope_id));

    SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
           r.runtime_cleanup_pending_since::text AS fence_set_at
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
    -- Anything that is not a known terminal status counts as active: it must block a delete.
    IF NOT (run.status = ANY (terminal)) THEN
      RETURN QUERY SELECT 'run_not_terminal'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF NOT run.runtime_cleanup_pending OR run.fence_set_at IS DISTINCT FROM p_fence_set_at THEN
      RETURN QUERY SELECT 'fence_gone'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    -- The statuses are spelled out (not the `terminal` variable): a variable is a parameter, and
    -- a cached generic plan could not then prove the partial index agent_runs_active_by_scope
    -- applies; it would scan the table.
    SELECT a.id INTO active_id FROM agent_runs a
      WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id AND a.id <> p_run_id
        AND a.status NOT IN ('completed', 'failed', 'cancelled', 'interrupted')
      ORDER BY a.id LIMIT 1;
    IF active_id IS NULL THEN
      WITH RECURSIVE descendants AS (
        SELECT a.id, a.status FROM agent_runs a WHERE a.created_by_run_id = p_run_id
        UNION
        SELECT a.id, a.status FROM agent_runs a JOIN descendants d ON a.created_by_run_id = d.id
      )
      SELECT d.id INTO active_id FROM descendants d WHERE NOT (d.status = ANY (terminal)) ORDER BY d.id LIMIT 1;
    END IF;
    IF active_id IS NOT NULL THEN
      RETURN QUERY SELECT 'scope_active'::text, active_id, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    -- FOR UPDATE: a concurrent writer of the row (the platform recording a new generation) is
    -- waited for, and the row read is the one the record below is written on.
    SELECT s.sandbox_id, s.generation, s.released_at, s.delete_in_flight_until
      INTO sandbox
      FROM sandbox_runtimes s
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
      FOR UPDATE;
    IF NOT FOUND OR sandbox.sandbox_id IS DISTINCT FROM p_sandbox_id OR sandbox.generation IS DISTINCT FROM p_generation THEN
      RETURN QUERY SELECT 'sandbox_mismatch'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF sandbox.released_at IS NOT NULL THEN
      RETURN QUERY SELECT 'already_released'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    previous_until := CASE WHEN sandbox.delete_in_flight_until > clock_timestamp() THEN sandbox.delete_in_flight_until END;
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
