-- Trigger function of sandbox_runtimes_refuse_reclaimed (created in migration 009). A platform
-- recording a sandbox id (a new row, or a row changing to that id or generation) while a reclaim
-- DELETE of that id may still act (the sighting's in-flight record, the attempt's tombstone's
-- refuse_all_until), or at a generation a confirmed reclaim deleted and the listing named (the
-- tombstone's reclaimed_generation, for the grace), is refused with SQLSTATE 55006: the platform's provisioner hands a
-- live container out again on POST, so the run would get the very sandbox the DELETE is removing.
-- The error names the sandbox and the deadline; the platform's acquisition fails and it retries
-- after. The reclaim lock makes the check and the guard's record strictly ordered.
--
-- Where a reclaim can be at work on the id (a sighting or a tombstone names it), READ COMMITTED is
-- required as for the decisions: under REPEATABLE READ this check would read a snapshot taken
-- before the reclaim lock below was granted and miss the guard's record (a platform whose database
-- defaults to REPEATABLE READ recorded the very container being deleted). Elsewhere the level is
-- left alone, so bulk loads under any level keep working.
CREATE OR REPLACE FUNCTION sandbox_runtimes_refuse_reclaimed() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
  DECLARE
    until timestamptz;
  BEGIN
    IF TG_OP = 'INSERT'
       OR NEW.sandbox_id IS DISTINCT FROM OLD.sandbox_id
       OR NEW.generation IS DISTINCT FROM OLD.generation THEN
      -- The lock only where a reclaim can be at work: an id with a sighting. Without one, no guard
      -- can act on it for a whole grace (it needs a sighting that old), by when this row is
      -- committed and the guard sees its owner. Locking every row instead took one advisory lock per
      -- id: a bulk upsert of 50 k sandboxes ran out of shared memory (max_locks_per_transaction).
      IF EXISTS (SELECT 1 FROM runtime_reclaim_sightings g WHERE g.sandbox_id = NEW.sandbox_id)
         OR EXISTS (SELECT 1 FROM runtime_reclaim_tombstones t WHERE t.sandbox_id = NEW.sandbox_id) THEN
        PERFORM runtime_cleanup_require_read_committed();
        PERFORM pg_advisory_xact_lock(runtime_reclaim_lock_key(NEW.sandbox_id));
      END IF;
      SELECT max(greatest(g.reclaim_in_flight_until, t.refuse_all_until)) INTO until
        FROM (SELECT NEW.sandbox_id AS sandbox_id) n
        LEFT JOIN runtime_reclaim_sightings g
          ON g.sandbox_id = n.sandbox_id AND g.reclaim_in_flight_until > clock_timestamp()
        LEFT JOIN runtime_reclaim_tombstones t
          ON t.sandbox_id = n.sandbox_id AND t.refuse_all_until > clock_timestamp();
      IF until IS NOT NULL THEN
        RAISE EXCEPTION 'sandbox % is being reclaimed (a DELETE may act until %); create or record it again after that', NEW.sandbox_id, until
          USING ERRCODE = '55006';
      END IF;
      -- A confirmed reclaim deleted this id at a generation the provisioner listed: a record of
      -- it, or of a generation not newer, names a deleted container.
      SELECT max(t.expires_at) INTO until FROM runtime_reclaim_tombstones t
        WHERE t.sandbox_id = NEW.sandbox_id AND t.expires_at > clock_timestamp()
          AND t.reclaimed_generation IS NOT NULL AND NEW.generation <= t.reclaimed_generation;
      IF until IS NOT NULL THEN
        RAISE EXCEPTION 'sandbox % generation % was reclaimed (deleted); create it again (POST) and record the new generation (refused for generations up to the deleted one until %)', NEW.sandbox_id, NEW.generation, until
          USING ERRCODE = '55006';
      END IF;
    END IF;
    RETURN NEW;
  END
  $$;
