-- Takes the two locks of a cleanup decision whose caller knows only the run id (phase 1,
-- force-clear): the scope's advisory lock first, then the run's row lock, in that order everywhere
-- (the platform's admission and the other phases take the scope lock first too), so two of them
-- never deadlock. Returns false when there is no such run.
--
-- The scope is only known from the row: read it, lock it, then lock and re-read the row. A row that
-- moved to another scope meanwhile is followed (both scope locks are then held until commit): a
-- decision taken under the old scope's lock alone would race the new scope's admissions.
--
-- Both locks last until the caller's transaction ends. The caller reads the row again in a
-- statement of its own: it is locked, so that read is what the decision rests on until commit.
CREATE OR REPLACE FUNCTION runtime_cleanup_lock_run(p_run_id text) RETURNS boolean
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    locked_uid text;
    locked_scope text;
    run record;
  BEGIN
    SELECT r.uid, r.runtime_scope_id INTO locked_uid, locked_scope FROM agent_runs r WHERE r.id = p_run_id;
    LOOP
      IF locked_uid IS NULL THEN
        RETURN false;
      END IF;
      PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(locked_uid, locked_scope));
      SELECT r.uid, r.runtime_scope_id INTO run FROM agent_runs r WHERE r.id = p_run_id FOR UPDATE;
      IF NOT FOUND THEN
        locked_uid := NULL;
      ELSIF run.uid = locked_uid AND run.runtime_scope_id = locked_scope THEN
        RETURN true;
      ELSE
        locked_uid := run.uid;
        locked_scope := run.runtime_scope_id;
      END IF;
    END LOOP;
  END
  $$;
