-- THE "is the scope active" question of the decisions (phase 1, the release guard, finalize,
-- force-clear): the first active run other than p_run_id in the scope, else the first active run
-- below p_run_id (runtime_cleanup_descendants), else NULL. Active = not a known terminal status,
-- NULL included (runtime_cleanup_status_is_active).
--
-- The scope lookup is written with runtime_cleanup_status_is_active so the partial index
-- agent_runs_active_by_scope applies, in the generic plan PL/pgSQL caches too; the scope is looked
-- at first because it is one index lookup, and most deferrals are found there.
--
-- PL/pgSQL, VOLATILE: each of its two statements takes a fresh READ COMMITTED snapshot, after the
-- caller's locks.
CREATE OR REPLACE FUNCTION runtime_cleanup_active_run(p_uid text, p_runtime_scope_id text, p_run_id text)
  RETURNS text
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    active_id text;
  BEGIN
    SELECT a.id INTO active_id FROM agent_runs a
      WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id AND a.id <> p_run_id
        AND runtime_cleanup_status_is_active(a.status)
      ORDER BY a.id LIMIT 1;
    IF active_id IS NULL THEN
      SELECT d.id INTO active_id FROM runtime_cleanup_descendants(p_run_id) d
        WHERE runtime_cleanup_status_is_active(d.status)
        ORDER BY d.id LIMIT 1;
    END IF;
    RETURN active_id;
  END
  $$;
