-- The platform's admission question (contract), asked under the scope's advisory lock: true while
-- any root run of the scope still has its fence up, or while a delete may still be in flight for
-- the scope's sandbox. The second arm exists because a forced clear can drop the fence before the
-- provisioner has answered a release's DELETE (or a reclaim's): the platform would then admit a
-- run, the provisioner (which reuses a live container on POST, and whose DELETE ignores the
-- generation) hand it the very sandbox the late DELETE then removed. The guards
-- (runtime_cleanup_begin_release, runtime_cleanup_begin_reclaim) write that record under the same
-- lock.
--
-- A subagent run's flag blocks nothing: only root runs own a cleanup. A NULL
-- runtime_cleanup_pending reads as "no fence" (as in the fence indexes of migration 006).
--
-- READ COMMITTED is required, as for the decisions: the platform asks this in the statement after
-- the one that took the scope's lock, and under REPEATABLE READ that statement would read the
-- snapshot its transaction took before the lock was granted, missing a guard's delete-in-flight
-- record committed meanwhile (a run admitted under a DELETE about to go out). Raising (SQLSTATE
-- 25000) turns a database that defaults to a higher level into a loud error at the platform's first
-- admission instead of a silent race. PL/pgSQL for the check; nothing inlines it.
--
-- now() is the caller's transaction start: comparing the deadline with an earlier time can only
-- keep the scope blocked a little longer, never admit early.
CREATE OR REPLACE FUNCTION runtime_cleanup_blocked(uid text, runtime_scope_id text) RETURNS boolean
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  AS $$
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    RETURN EXISTS (
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
    );
  END
  $$;
