-- Every run created, directly or transitively, by p_run_id, in any scope (a subagent run may live
-- in another scope, and its work still depends on the root's sandbox being left alone until it
-- ends). THE descendant walk: runtime_cleanup_active_run and `ops explain` both read it, so the
-- decisions and what an operator is shown can never disagree about which runs are below a run.
--
-- Cycles (a created_by_run_id chain that loops back, written by a platform bug) end the walk
-- instead of hanging it: UNION, not UNION ALL, drops a row already produced, and a run met again
-- is the very same row. There is no depth limit: a depth limit would hide the deepest descendants
-- from exactly the checks that must see them.
--
-- LANGUAGE sql, STABLE: it reads the caller's snapshot (a decision calls it after taking its locks,
-- in a statement of its own, so it sees what was committed before them).
CREATE OR REPLACE FUNCTION runtime_cleanup_descendants(p_run_id text)
  RETURNS TABLE (id text, status text, run_type text, runtime_scope_id text)
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    WITH RECURSIVE descendants AS (
      SELECT a.id, a.status, a.run_type, a.runtime_scope_id
      FROM agent_runs a WHERE a.created_by_run_id = p_run_id
      UNION
      SELECT a.id, a.status, a.run_type, a.runtime_scope_id
      FROM agent_runs a JOIN descendants d ON a.created_by_run_id = d.id
    )
    SELECT d.id, d.status, d.run_type, d.runtime_scope_id FROM descendants d
  $$;
