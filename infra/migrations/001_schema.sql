-- The contract's schema (contract.md, section 1). Extra columns are nullable or defaulted so
-- that a row written with only the contract's columns stays valid.
--
-- Written to be idempotent (IF NOT EXISTS, OR REPLACE): a platform database that already has the
-- contract's tables, created by the platform itself, is adopted rather than refused.

CREATE TABLE IF NOT EXISTS conversations (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  uid           text NOT NULL,
  thread_id     text NOT NULL UNIQUE,
  workdir_path  text NOT NULL
);

CREATE TABLE IF NOT EXISTS agent_runs (
  id                      text PRIMARY KEY,
  uid                     text NOT NULL,
  conversation_id         bigint REFERENCES conversations(id),
  conversation_thread_id  text NOT NULL,
  runtime_scope_id        text NOT NULL,
  run_type                text NOT NULL DEFAULT 'chat',
  created_by_run_id       text,
  status                  text NOT NULL,
  runtime_cleanup_pending boolean NOT NULL DEFAULT false,
  worker_id               text,
  heartbeat_at            timestamptz,
  lease_expires_at        timestamptz,
  finished_at             timestamptz,
  created_at              timestamptz NOT NULL DEFAULT now(),
  updated_at              timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS sandbox_runtimes (
  uid               text NOT NULL,
  runtime_scope_id  text NOT NULL,
  sandbox_id        text NOT NULL,
  generation        bigint NOT NULL,
  released_at       timestamptz,
  PRIMARY KEY (uid, runtime_scope_id)
);

-- Finding the non-terminal runs of a scope is on every phase's path and on the platform's
-- admission path; only live runs are indexed, so the index stays small.
CREATE INDEX IF NOT EXISTS agent_runs_active_by_scope ON agent_runs (uid, runtime_scope_id)
  WHERE status NOT IN ('completed', 'failed', 'cancelled', 'interrupted');

CREATE INDEX IF NOT EXISTS agent_runs_by_parent ON agent_runs (created_by_run_id) WHERE created_by_run_id IS NOT NULL;

-- The advisory lock key of a runtime scope. The uid's length is part of the hashed text so that
-- ('a:b', 'c') and ('a', 'b:c') do not share a key by construction.
CREATE OR REPLACE FUNCTION runtime_cleanup_lock_key(uid text, runtime_scope_id text) RETURNS bigint
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$ SELECT hashtextextended(length(uid)::text || ':' || uid || ':' || runtime_scope_id, 0) $$;

-- True while any root run of the scope still carries the fence. The platform's admission of a
-- new run in the scope checks it (ideally holding the scope's advisory lock).
CREATE OR REPLACE FUNCTION runtime_cleanup_blocked(uid text, runtime_scope_id text) RETURNS boolean
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT EXISTS (
      SELECT 1 FROM agent_runs r
      WHERE r.uid = runtime_cleanup_blocked.uid
        AND r.runtime_scope_id = runtime_cleanup_blocked.runtime_scope_id
        AND r.run_type <> 'subagent'
        AND r.runtime_cleanup_pending
    )
  $$;
