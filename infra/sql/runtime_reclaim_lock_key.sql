-- The advisory lock that serialises the reclaim guard of one sandbox id (runtime_cleanup_begin_reclaim)
-- with any write that makes a scope name that id (the trigger sandbox_runtimes_refuse_reclaimed).
-- Apart from runtime_cleanup_lock_key's keys: the hashed texts never coincide (this one starts with
-- 'reclaim:', a scope's with the uid's length).
CREATE OR REPLACE FUNCTION runtime_reclaim_lock_key(sandbox_id text) RETURNS bigint
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$ SELECT hashtextextended('reclaim:' || sandbox_id, 0) $$;
