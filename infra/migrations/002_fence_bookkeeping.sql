-- Bookkeeping the protocol needs beyond the contract's columns, all nullable and maintained by
-- the database itself, so the platform keeps writing only the contract's columns.
--
-- runtime_cleanup_pending_since: when the fence was last raised. Phase 1 captures it and phase 3
--   re-checks it, so a cleanup that started before the fence was raised again can never clear
--   the newer fence. The sweeper also measures a fence's age from it.
-- runtime_cleanup_announced_at: when the sweeper last re-announced the fence, so one tick does
--   not re-announce what the previous tick already did.
ALTER TABLE agent_runs
  ADD COLUMN IF NOT EXISTS runtime_cleanup_pending_since timestamptz,
  ADD COLUMN IF NOT EXISTS runtime_cleanup_announced_at timestamptz;

UPDATE agent_runs SET runtime_cleanup_pending_since = coalesce(finished_at, updated_at)
  WHERE runtime_cleanup_pending AND runtime_cleanup_pending_since IS NULL;

-- The trigger function agent_runs_track_fence: infra/sql/agent_runs_track_fence.sql.
DROP TRIGGER IF EXISTS agent_runs_track_fence ON agent_runs;
CREATE TRIGGER agent_runs_track_fence
  BEFORE INSERT OR UPDATE OF runtime_cleanup_pending ON agent_runs
  FOR EACH ROW EXECUTE FUNCTION agent_runs_track_fence();

-- The sweeper and the operator CLI list pending fences oldest first.
CREATE INDEX IF NOT EXISTS agent_runs_pending_fences ON agent_runs (runtime_cleanup_pending_since)
  WHERE runtime_cleanup_pending;
