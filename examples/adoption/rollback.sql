-- Undoes adopt.sql and everything `npm run migrate` added (docs/adopting.md, "Rolling back"): the
-- platform's tables end as platform-schema.sql made them, with their rows. Run it only once the
-- platform no longer raises fences, the cleanup's deployment (the reclaimer included) is removed,
-- no fence is pending and no DELETE may still act; only then revert the admission.
-- One transaction: a failure leaves the database as it was.
BEGIN;

-- Refuse, before anything is dropped, while that is not so: a pending fence dropped here leaves
-- its sandbox running and the thread admitting runs; a release's or a reclaim's DELETE that may
-- still act would, once the records saying so are gone, land on the container a run admitted by
-- the reverted API is handed (the provisioner gives the live one out again on POST).
DO $$
DECLARE
  fences bigint;
  until timestamptz;
BEGIN
  SELECT count(*) INTO fences FROM agent_runs WHERE runtime_cleanup_pending;
  SELECT max(w) INTO until FROM (
    SELECT delete_in_flight_until FROM sandbox_runtimes
    UNION ALL SELECT reclaim_in_flight_until FROM runtime_reclaim_sightings
    UNION ALL SELECT refuse_all_until FROM runtime_reclaim_tombstones
  ) AS windows (w)
  WHERE w > clock_timestamp();
  IF fences > 0 THEN
    RAISE EXCEPTION 'rollback refused: % fence(s) still pending (npm run ops -- fences); nothing was changed', fences
      USING HINT = 'Wait until every fence has cleared (docs/adopting.md, "Rolling back"), then run it again.';
  END IF;
  IF until IS NOT NULL THEN
    RAISE EXCEPTION 'rollback refused: a DELETE of a sandbox may still act until %; nothing was changed', until
      USING HINT = 'Run it again after that time, with the cleanup''s deployment removed (docs/adopting.md, "Rolling back").';
  END IF;
END
$$;

-- The cleanup's own tables, functions and triggers (infra/migrations/, infra/sql/).
DROP TABLE IF EXISTS sandbox_runtimes, runtime_cleanup_overrides, runtime_cleanup_settings,
  runtime_reclaim_sightings, runtime_reclaim_tombstones, runtime_reclaim_pairings,
  schema_migrations, schema_functions;
DROP TRIGGER IF EXISTS agent_runs_track_fence ON agent_runs;
DO $$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure FROM pg_proc p
    WHERE p.pronamespace = current_schema()::regnamespace
      AND (p.proname LIKE 'runtime\_cleanup\_%' OR p.proname LIKE 'runtime\_reclaim\_%'
           OR p.proname IN ('agent_runs_track_fence', 'sandbox_runtimes_reset_released',
                            'sandbox_runtimes_refuse_reclaimed'))
  LOOP
    EXECUTE format('DROP FUNCTION %s CASCADE', f);   -- CASCADE: the indexes written with them
  END LOOP;
END
$$;

DROP VIEW conversations;
-- Dropping a column drops the indexes on it (the migrations' agent_runs_* indexes).
ALTER TABLE agent_runs
  DROP COLUMN runtime_cleanup_pending_since,
  DROP COLUMN runtime_cleanup_announced_at,
  DROP COLUMN runtime_cleanup_pending,
  DROP COLUMN lease_expires_at,
  DROP COLUMN heartbeat_at,
  DROP COLUMN worker_id,
  DROP COLUMN conversation_id,
  DROP COLUMN run_type,
  DROP COLUMN created_by_run_id,
  DROP COLUMN runtime_scope_id,
  DROP COLUMN conversation_thread_id,
  DROP COLUMN uid;

ALTER TABLE agent_runs
  ALTER COLUMN created_at DROP DEFAULT,
  ALTER COLUMN updated_at DROP DEFAULT;
ALTER TABLE agent_runs
  ALTER COLUMN created_at TYPE timestamp without time zone USING created_at AT TIME ZONE 'UTC',
  ALTER COLUMN updated_at TYPE timestamp without time zone USING updated_at AT TIME ZONE 'UTC',
  ALTER COLUMN finished_at TYPE timestamp without time zone USING finished_at AT TIME ZONE 'UTC';
ALTER TABLE agent_runs
  ALTER COLUMN created_at SET DEFAULT (now() AT TIME ZONE 'utc'),
  ALTER COLUMN updated_at SET DEFAULT (now() AT TIME ZONE 'utc');

COMMIT;
