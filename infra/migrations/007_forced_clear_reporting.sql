-- ForcedClears reaches CloudWatch from the deployed side: the sweeper counts the forced clears it
-- has not reported yet and emits that count with its other metrics (functions/sweeper/forced-clears.ts).
-- The operator CLI cannot: its output goes to a terminal, never to CloudWatch.
--
-- metric_reported_at: when the sweeper counted this row, NULL until then. Set once, by one
--   statement that claims and counts (two sweepers never count a row twice). The audit columns
--   of migration 003 stay insert-only.
ALTER TABLE runtime_cleanup_overrides ADD COLUMN metric_reported_at timestamptz;

-- Forced clears made before this migration were never reported anywhere; they are history, not
-- news: counting them now would page on the past.
UPDATE runtime_cleanup_overrides SET metric_reported_at = forced_at;

CREATE INDEX runtime_cleanup_overrides_unreported ON runtime_cleanup_overrides (id)
  WHERE metric_reported_at IS NULL;
