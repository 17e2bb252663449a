-- THE list of terminal run statuses: the one place it is written (test/unit/sql-rules.test.ts
-- fails on a second literal list in any .sql file, and ties functions/cleanup/types.ts's
-- TERMINAL_RUN_STATUSES to this body).
--
-- Two-valued on purpose: a NULL status (a platform that inserts a run before writing its status,
-- on an adopted table whose NOT NULL was dropped again) is NOT terminal. Written as
-- `status IN (…)` alone it would answer NULL, and `NOT` of that is NULL again: every decision
-- that asked "not terminal?" through it would have taken such a run for finished, which is how a
-- sibling's cleanup once deleted the sandbox a queued run was about to use (migration 008, item 6).
--
-- LANGUAGE sql, IMMUTABLE, not STRICT: PostgreSQL inlines the body wherever the function is
-- called, in queries and in index predicates alike, so a partial index written with
-- runtime_cleanup_status_is_active (agent_runs_active_by_scope) is proved usable for a query
-- written with the same call, including a generic plan with parameters (a PL/pgSQL variable
-- holding the list could not be: see runtime_cleanup_status_is_active). STRICT would stop the
-- inlining (the body is not strict) and answer NULL for NULL.
CREATE OR REPLACE FUNCTION runtime_cleanup_status_is_terminal(status text) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT status IS NOT NULL AND status IN ('completed', 'failed', 'cancelled', 'interrupted') $$;
