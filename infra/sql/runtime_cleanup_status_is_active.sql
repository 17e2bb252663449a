-- "Active" = anything that is not a known terminal status, NULL and unknown statuses included: an
-- unknown status must block a delete, never allow one. Every decision, the reclaim scope hold, the
-- operator CLI and the partial index agent_runs_active_by_scope ask it through this function.
--
-- Inlined (LANGUAGE sql, IMMUTABLE) into `status IS NULL OR status <> ALL ('{…}')`, the same
-- expression in a query as in the index predicate, so the planner proves the partial index applies
-- (test/integration/shared-predicates.test.ts EXPLAINs it, custom and generic plans). The
-- statuses used to be spelled out in every PL/pgSQL query for that reason: a cached generic plan
-- cannot prove a partial index from a variable holding the list. A call of this function can be.
CREATE OR REPLACE FUNCTION runtime_cleanup_status_is_active(status text) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT NOT runtime_cleanup_status_is_terminal(status) $$;
