-- The advisory lock key of a runtime scope (contract: the platform's admission takes the very
-- same lock). The uid's length is part of the hashed text so that ('a:b', 'c') and ('a', 'b:c')
-- do not share a key by construction.
CREATE OR REPLACE FUNCTION runtime_cleanup_lock_key(uid text, runtime_scope_id text) RETURNS bigint
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$ SELECT hashtextextended(length(uid)::text || ':' || uid || ':' || runtime_scope_id, 0) $$;
