-- Admission and the sweeper at scale (issue 11, item 6): every lookup of fences is an index
-- lookup whatever the backlog, and a fence whose `runtime_cleanup_pending_since` is NULL (raised
-- by a write that bypassed the trigger of 002: `session_replication_role = replica`, disabled
-- triggers, a bulk load) is still seen by the sweeper, the backlog metrics and `ops fences`.
--
-- Only root fences are indexed (`run_type <> 'subagent'`): a subagent's flag blocks nothing.
--
-- Note for large tables: the migration runner applies a file in one transaction, so these are
-- plain CREATE INDEX (they block writes to agent_runs while they build; each reads the table
-- once and keeps only the pending fences). On a very large table, create them beforehand with
-- CREATE INDEX CONCURRENTLY under the same names; IF NOT EXISTS then skips them here.

-- runtime_cleanup_blocked, called under the scope's advisory lock on every admission. Without it
-- the planner walked every pending fence fleet-wide (250-360 ms with 50 k of them on 10 M runs).
CREATE INDEX IF NOT EXISTS agent_runs_fences_by_scope ON agent_runs (uid, runtime_scope_id)
  WHERE runtime_cleanup_pending AND run_type <> 'subagent';

-- A fence's age is measured from when it was raised; when that was not recorded (NULL), from when
-- its run finished, else from the row's last update: an estimate, but never "no age at all",
-- which made such a fence invisible to the sweeper and to the oldest-fence alarm.
--
-- `ops fences` (oldest first) and the sweeper's backlog figures (count, oldest) read this one.
CREATE INDEX IF NOT EXISTS agent_runs_fences_by_age
  ON agent_runs ((coalesce(runtime_cleanup_pending_since, finished_at, updated_at)), id)
  WHERE runtime_cleanup_pending AND run_type <> 'subagent';

-- The sweeper's claim: a fence is due once both its age and its last announcement are older than
-- FENCE_SWEEP_AFTER_SECONDS, i.e. once the later of the two is (greatest() skips a NULL
-- announcement). Indexing that one moment makes the claim a range scan of exactly the due fences,
-- however many fences were announced recently and are still pending (an outage's backlog).
CREATE INDEX IF NOT EXISTS agent_runs_fences_due
  ON agent_runs ((greatest(coalesce(runtime_cleanup_pending_since, finished_at, updated_at), runtime_cleanup_announced_at)))
  WHERE runtime_cleanup_pending AND run_type <> 'subagent';

-- Superseded by the three above (nothing reads it any more; it also held subagent fences).
DROP INDEX IF EXISTS agent_runs_pending_fences;
