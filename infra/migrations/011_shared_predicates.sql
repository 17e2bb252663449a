-- Issue 23, "one home for each rule": what databases migrated before the SQL functions moved to
-- infra/sql/ still have that the current schema does not. On a database migrated from scratch
-- since, each statement finds nothing to do. test/integration/migrate-history.test.ts builds a
-- database with the old migration texts and checks it ends identical to a fresh one.

-- The benchmark's lock-taken note (old 010): the product's decision functions no longer call it;
-- the benchmark installs it into its own databases.
DROP FUNCTION IF EXISTS runtime_cleanup_note_lock_taken();

-- agent_runs_active_by_scope with the shared predicate (001): the old index spelled the terminal
-- statuses out and left a NULL status out. Rebuilt only when its predicate is another: create it
-- beforehand with CREATE INDEX CONCURRENTLY on a very large table (under another name, then drop
-- the old one and rename), and this finds nothing to do.
DO $$
BEGIN
  IF (SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i
      WHERE i.indexrelid = to_regclass('agent_runs_active_by_scope'))
     IS DISTINCT FROM 'runtime_cleanup_status_is_active(status)' THEN
    DROP INDEX IF EXISTS agent_runs_active_by_scope;
    CREATE INDEX agent_runs_active_by_scope ON agent_runs (uid, runtime_scope_id)
      WHERE runtime_cleanup_status_is_active(status);
  END IF;
END
$$;

-- Subsumed: agent_runs_active_by_scope holds the runs whose status is NULL now (008 made this one
-- for them alone).
DROP INDEX IF EXISTS agent_runs_null_status_by_scope;
