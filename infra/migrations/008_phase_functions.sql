-- Phase 1 and phase 3 decide inside PostgreSQL (issue 15), the release mark is bound to the
-- generation it released, and the decisions rely on the contract's NOT NULL columns. The
-- decision functions this migration defined live in infra/sql/ (runtime_cleanup_fence_check,
-- runtime_cleanup_finalize, runtime_cleanup_begin_release and their helpers), with the reasons:
-- one round trip under the lock, READ COMMITTED enforced (runtime_cleanup_require_read_committed),
-- the release mark naming its generation (runtime_cleanup_generation_released), no "cleaned"
-- while a delete may still be in flight, the fence's identity as an instant. What stays here:
--
-- NULLs in an adopted platform table (001 adopts an existing `agent_runs` as it is). The
-- decisions rely on the contract's NOT NULL columns; a NULL `status` read through
-- `status NOT IN (…)` or `NOT (status = ANY (…))` is neither active nor non-terminal, so a run
-- whose status was not written yet counted as finished. The contract's NOT NULLs are enforced
-- below (refusing, with the offending column named, a table holding NULLs), and every predicate
-- counts a NULL status as active all the same (runtime_cleanup_status_is_active: a constraint can
-- be dropped again later). A NULL `runtime_cleanup_pending` reads as "no fence", as in
-- `runtime_cleanup_blocked` and the fence indexes of 006.
--
-- The release mark's naming columns, released_sandbox_id and released_generation, without a
-- backfill (below).

DO $$
DECLARE
  col text;
  nulls bigint;
BEGIN
  FOREACH col IN ARRAY ARRAY['uid', 'runtime_scope_id', 'run_type', 'status', 'runtime_cleanup_pending'] LOOP
    IF EXISTS (SELECT 1 FROM information_schema.columns c
               WHERE c.table_schema = current_schema() AND c.table_name = 'agent_runs'
                 AND c.column_name = col AND c.is_nullable = 'YES') THEN
      EXECUTE format('SELECT count(*) FROM agent_runs WHERE %I IS NULL', col) INTO nulls;
      IF nulls > 0 THEN
        RAISE EXCEPTION 'agent_runs.% is NULL in % row(s); the runtime cleanup contract requires it NOT NULL', col, nulls
          USING ERRCODE = 'not_null_violation',
                HINT = 'Fill the column in those rows (a run without a status is not finished), then apply the migration again.';
      END IF;
      EXECUTE format('ALTER TABLE agent_runs ALTER COLUMN %I SET NOT NULL', col);
    END IF;
  END LOOP;
END
$$;

-- Runs whose status is NULL, should the NOT NULL above be dropped again: a NULL status counts as
-- active, and this (normally empty) index let the scope lookup of runtime_cleanup_active_run
-- find them beside agent_runs_active_by_scope (a BitmapOr of the two) instead of scanning.
-- Dropped again by 011: agent_runs_active_by_scope now holds NULL statuses itself.
CREATE INDEX IF NOT EXISTS agent_runs_null_status_by_scope ON agent_runs (uid, runtime_scope_id)
  WHERE status IS NULL;

ALTER TABLE sandbox_runtimes
  ADD COLUMN IF NOT EXISTS released_sandbox_id text,
  ADD COLUMN IF NOT EXISTS released_generation bigint;

-- No backfill: a mark made before this migration names no generation, so it counts as "not
-- released". Copying the row's current (sandbox_id, generation) into it would certify as released exactly
-- the stale marks runtime_cleanup_generation_released exists for (a generation recorded under an old released_at by a write that
-- bypassed the 005 trigger before this migration ran). The cost of not backfilling
-- is one idempotent DELETE, answered 404, for each such scope at its next cleanup.
