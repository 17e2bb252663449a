-- When a scope was last active, for the reclaim scope hold's `scope_recent`: its runs' creation,
-- update and finish, and forced clears of its fences. -infinity when nothing is known (a row
-- recorded without runs). Reads every run of the scope, terminal ones included: the plain index
-- agent_runs_by_scope (migration 009) keeps that an index lookup (148 s for 5 000 listed sandboxes
-- over 200 000 runs without it, 1.2 s with it).
CREATE OR REPLACE FUNCTION runtime_reclaim_scope_last_activity(p_uid text, p_runtime_scope_id text)
  RETURNS timestamptz
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT coalesce(greatest(
      (SELECT max(greatest(r.created_at, r.updated_at, r.finished_at)) FROM agent_runs r
        WHERE r.uid = p_uid AND r.runtime_scope_id = p_runtime_scope_id),
      (SELECT max(o.forced_at) FROM runtime_cleanup_overrides o
        WHERE o.uid = p_uid AND o.runtime_scope_id = p_runtime_scope_id)
    ), '-infinity'::timestamptz)
  $$;
