-- Trigger function of agent_runs_track_fence (created in migration 002): the database, not the
-- platform, keeps the fence's bookkeeping, so the platform keeps writing only the contract's
-- columns.
--
-- runtime_cleanup_pending_since is the fence's identity: phase 1 captures it and phase 3 and the
-- release guard re-check it, so a cleanup that started before the fence was raised again can never
-- clear the newer fence. clock_timestamp(), not now(): two raises in one transaction stay apart.
-- runtime_cleanup_announced_at starts again with each raise, so the sweeper's first announcement
-- of a new fence is not skipped as "announced recently".
CREATE OR REPLACE FUNCTION agent_runs_track_fence() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
  BEGIN
    IF NEW.runtime_cleanup_pending AND (TG_OP = 'INSERT' OR NOT OLD.runtime_cleanup_pending) THEN
      NEW.runtime_cleanup_pending_since := clock_timestamp();
      NEW.runtime_cleanup_announced_at := NULL;
    ELSIF NOT NEW.runtime_cleanup_pending THEN
      NEW.runtime_cleanup_pending_since := NULL;
      NEW.runtime_cleanup_announced_at := NULL;
    END IF;
    RETURN NEW;
  END
  $$;
