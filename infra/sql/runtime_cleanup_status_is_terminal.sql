-- A known terminal status: the negation of runtime_cleanup_status_is_active, which holds the list.
-- Two-valued: a NULL status is NOT terminal (false, never NULL), so `NOT
-- runtime_cleanup_status_is_terminal(status)` is safe to write where `NOT (status = ANY (…))` was
-- not (it is NULL for a NULL status, and a decision took such a run for finished).
--
-- LANGUAGE sql, IMMUTABLE, not STRICT: inlined wherever it is called (into
-- `status IS NOT NULL AND status = ANY ('{…}')`). It calls runtime_cleanup_status_is_active, so
-- it must not be used in an index predicate (see that file: CREATE INDEX runs with a search_path
-- that does not find it).
CREATE OR REPLACE FUNCTION runtime_cleanup_status_is_terminal(status text) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT NOT runtime_cleanup_status_is_active(status) $$;
