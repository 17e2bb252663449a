-- The contract's schema (contract.md, section 1). Extra columns are nullable or defaulted so
-- that a row written with only the contract's columns stays valid.
--
-- Written to be idempotent (IF NOT EXISTS): a platform database that already has the contract's
-- tables, created by the platform itself, is adopted rather than refused.
--
-- The contract's functions runtime_cleanup_lock_key and runtime_cleanup_blocked, first defined
-- here, live in infra/sql/ (one file per function, applied before the migrations).

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

-- Finding the active runs of a scope is on every phase's path and on the platform's admission
-- path; only live runs are indexed, so the index stays small. The predicate is the shared one
-- (infra/sql/runtime_cleanup_status_is_active.sql, NULL status included), which the planner
-- inlines here and in every query written with it. Before issue 23 it spelled the statuses out and
-- left NULL out; migration 011 rebuilds such an index.
CREATE INDEX IF NOT EXISTS agent_runs_active_by_scope ON agent_runs (uid, runtime_scope_id)
  WHERE runtime_cleanup_status_is_active(status);

CREATE INDEX IF NOT EXISTS agent_runs_by_parent ON agent_runs (created_by_run_id) WHERE created_by_run_id IS NOT NULL;
