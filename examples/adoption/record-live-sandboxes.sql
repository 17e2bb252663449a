-- The cut-over's record of the sandboxes in use (docs/adopting.md, "Cutting over"): run it AFTER
-- `npm run migrate` and after the platform's admission and sandbox record (the API's change) is
-- rolled out on every instance, and before the cleanup (the reclaimer included) is deployed. Every
-- thread with a live run admitted by the old API has a sandbox nobody recorded; recorded here, the
-- run's cleanup deletes it when the run ends, and the reclaimer never counts it as leaked. The id is
-- derived as the platform derives it (Python: "sbx-" + hashlib.sha256(thread_id.encode()).hexdigest()[:12]);
-- the generation is the platform's own counter, started at 1 (the provisioner reports none).
-- Idempotent: a scope already recorded is left as it is.
--
-- One thread at a time, each in a subtransaction: the database's own refusal
-- (sandbox_runtimes_refuse_reclaimed, SQLSTATE 55006: a reclaim's DELETE of that id may still act)
-- then skips that thread alone instead of aborting the record of every other one. The trigger is
-- the rule; this script does not restate it. The skipped threads are the final SELECT's rows (and a
-- NOTICE each): run the script again after the time each names, once the reclaim is over.
CREATE TEMP TABLE IF NOT EXISTS record_live_sandboxes_skipped (
  uid text, runtime_scope_id text, sandbox_id text, refusal text);
TRUNCATE record_live_sandboxes_skipped;
DO $$
DECLARE
  live record;
  skipped integer := 0;
BEGIN
  FOR live IN
    SELECT DISTINCT r.uid, r.runtime_scope_id,
           'sbx-' || left(encode(sha256(convert_to(r.thread_id, 'UTF8')), 'hex'), 12) AS sandbox_id
    FROM agent_runs r
    WHERE runtime_cleanup_status_is_active(r.status)
    ORDER BY r.uid, r.runtime_scope_id
  LOOP
    BEGIN
      INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
      VALUES (live.uid, live.runtime_scope_id, live.sandbox_id, 1)
      ON CONFLICT (uid, runtime_scope_id) DO NOTHING;
    EXCEPTION WHEN SQLSTATE '55006' THEN
      skipped := skipped + 1;
      INSERT INTO record_live_sandboxes_skipped
      VALUES (live.uid, live.runtime_scope_id, live.sandbox_id, SQLERRM);
      RAISE NOTICE 'skipped: thread % of user % (sandbox %): %',
        live.runtime_scope_id, live.uid, live.sandbox_id, SQLERRM;
    END;
  END LOOP;
  IF skipped > 0 THEN
    RAISE NOTICE 'record-live-sandboxes: % thread(s) skipped, every other live thread recorded', skipped;
  END IF;
END
$$;
SELECT uid, runtime_scope_id, sandbox_id, refusal AS skipped_because FROM record_live_sandboxes_skipped
ORDER BY uid, runtime_scope_id;
