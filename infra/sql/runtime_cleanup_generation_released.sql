-- THE rule for "this generation was confirmed gone", asked by phase 1, the release guard, finalize,
-- force-clear, the reclaimer's classification and the operator CLI (test/unit/sql-rules.test.ts
-- fails on a `released_at IS NOT NULL` test of its own anywhere else).
--
-- `released_at` alone is not trusted: a platform write that bypasses the trigger
-- sandbox_runtimes_reset_released (`ALTER TABLE … DISABLE TRIGGER`, a restore under
-- `session_replication_role = replica`) could record a new generation under a row that still
-- carried the old `released_at`, and the live new sandbox then looked released: phase 1 said
-- "nothing to delete" and finalize cleared the fence over it. A generation counts as released only
-- when `released_sandbox_id` and `released_generation` name the row's current sandbox id and
-- generation; finalize writes all three together. A mark made before migration 008 names nothing
-- and is not backfilled (see 008): it costs one idempotent DELETE, answered 404.
--
-- Two-valued (never NULL) and IMMUTABLE: it reads only its arguments.
CREATE OR REPLACE FUNCTION runtime_cleanup_generation_released(
  released_at timestamptz, released_sandbox_id text, released_generation bigint,
  sandbox_id text, generation bigint
) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$
    SELECT released_at IS NOT NULL
       AND released_sandbox_id IS NOT DISTINCT FROM sandbox_id
       AND released_generation IS NOT DISTINCT FROM generation
  $$;
