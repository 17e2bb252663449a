-- Why a scope keeps a sandbox it names, or NULL when it does not (at the caller's snapshot). Asked
-- for each owner of a listed sandbox by the reclaimer's classification (functions/cleanup/reclaim.ts)
-- and again under the locks by the reclaim guard (runtime_cleanup_begin_reclaim):
--   scope_active      an active run in the scope: runtime_cleanup_status_is_active, so a NULL
--                     status holds the sandbox as it blocks every cleanup decision (this hold used
--                     to read `status NOT IN (…)`, which is NULL for a NULL status: a queued run's
--                     sandbox could be reclaimed while every phase deferred for that very run)
--   scope_fenced      a root run's fence is up: its cleanup owns the delete
--   delete_in_flight  a release's (or another reclaim's) DELETE may still act
--   scope_recent      active less than p_grace_seconds ago (runtime_reclaim_scope_last_activity)
-- Runs below a run in other scopes do not hold this scope's sandbox: each scope holds its own.
CREATE OR REPLACE FUNCTION runtime_reclaim_scope_hold(p_uid text, p_runtime_scope_id text, p_grace_seconds double precision)
  RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT CASE
      WHEN EXISTS (SELECT 1 FROM agent_runs a
                   WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id
                     AND runtime_cleanup_status_is_active(a.status))
        THEN 'scope_active'
      WHEN EXISTS (SELECT 1 FROM agent_runs a
                   WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id
                     AND a.runtime_cleanup_pending AND a.run_type <> 'subagent')
        THEN 'scope_fenced'
      WHEN EXISTS (SELECT 1 FROM sandbox_runtimes s
                   WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
                     AND s.delete_in_flight_until > clock_timestamp())
        THEN 'delete_in_flight'
      WHEN runtime_reclaim_scope_last_activity(p_uid, p_runtime_scope_id)
           > clock_timestamp() - make_interval(secs => p_grace_seconds)
        THEN 'scope_recent'
    END
  $$;
