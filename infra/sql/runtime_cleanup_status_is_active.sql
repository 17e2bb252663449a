-- "Active" = anything that is not a known terminal status, NULL and unknown statuses included: an
-- unknown status must block a delete, never allow one. THE list of terminal statuses is here, the
-- one place it is written (test/unit/sql-rules.test.ts fails on a second literal list in any .sql
-- file; infra/run-statuses.ts reads the list from this body for the local tools). Every decision,
-- the reclaim scope hold, the operator CLI and the partial index agent_runs_active_by_scope ask it
-- through this function or runtime_cleanup_status_is_terminal (its negation).
--
-- NULL is active, and the answer is never NULL: written as `status NOT IN (…)` alone it would be
-- NULL for a NULL status (a platform that inserts a run before writing its status, on an adopted
-- table whose NOT NULL was dropped again), and every decision that asked "active?" through it took
-- such a run for finished, which is how a sibling's cleanup once deleted the sandbox a queued run
-- was about to use (migration 008).
--
-- LANGUAGE sql, IMMUTABLE, not STRICT: PostgreSQL inlines the body wherever the function is called,
-- in queries and in index predicates alike, into `status IS NULL OR status <> ALL ('{…}')`, so the
-- planner proves the partial index applies to a query written with the same call, in a generic plan
-- with parameters too (test/integration/null-status-adopted-schema.test.ts EXPLAINs both). The
-- statuses used to be spelled out in every PL/pgSQL query for that reason: a cached generic plan
-- cannot prove a partial index from a variable holding the list. STRICT would stop the inlining (the
-- body is not strict) and answer NULL for NULL.
--
-- The body names built-ins only, on purpose: PostgreSQL 17 and later evaluate an index predicate
-- during CREATE INDEX and REINDEX with `search_path = pg_catalog, pg_temp`, where a call of another
-- function of this schema would not be found. A function used in an index predicate must not call
-- one of ours.
CREATE OR REPLACE FUNCTION runtime_cleanup_status_is_active(status text) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT status IS NULL OR status NOT IN ('completed', 'failed', 'cancelled', 'interrupted') $$;
