-- The cut-over's record of the sandboxes in use (docs/adopting.md, "Cutting over"): run it AFTER
-- `npm run migrate` and before the worker starts raising fences, and once more after the worker's
-- change is deployed (for the threads that went live in between). Every thread with a live
-- run has a sandbox the platform created before it recorded any; recorded here, the run's cleanup
-- deletes it when the run ends, and the reclaimer never counts it as leaked. The id is derived as
-- the platform derives it (Python: "sbx-" + hashlib.sha256(thread_id.encode()).hexdigest()[:12]);
-- the generation is the platform's own counter, started at 1 (the provisioner reports none).
-- Idempotent: a scope already recorded is left as it is.
INSERT INTO sandbox_runtimes (uid, runtime_scope_id, sandbox_id, generation)
SELECT DISTINCT r.uid, r.runtime_scope_id,
       'sbx-' || left(encode(sha256(convert_to(r.thread_id, 'UTF8')), 'hex'), 12), 1
FROM agent_runs r
WHERE runtime_cleanup_status_is_active(r.status)
ON CONFLICT (uid, runtime_scope_id) DO NOTHING;
