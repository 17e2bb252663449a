-- The adoption step of docs/adopting.md for the platform of platform-schema.sql: run it once,
-- BEFORE the first `npm run migrate` (`psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f adopt.sql`). It
-- maps the platform's tables onto the contract (docs/integration.md, section 1) without renaming
-- anything the platform's code reads or writes; rollback.sql undoes it. One transaction: a failure
-- leaves the database as it was.
--
-- Written for that example schema; another platform changes the expressions, not the method.
BEGIN;

-- 1. Naive times become instants. The cleanup compares these columns with now() (a fence's age,
--    a scope's last activity for the reclaimer) and indexes an expression over them, which
--    PostgreSQL refuses over `timestamp without time zone` (its cast to timestamptz depends on the
--    session's TimeZone). The platform wrote them in UTC, so they are read as UTC; its defaults,
--    `now() AT TIME ZONE 'utc'`, would now be read in the session's TimeZone, so they become now().
ALTER TABLE agent_runs
  ALTER COLUMN created_at DROP DEFAULT,
  ALTER COLUMN updated_at DROP DEFAULT;
ALTER TABLE agent_runs
  ALTER COLUMN created_at TYPE timestamptz USING created_at AT TIME ZONE 'UTC',
  ALTER COLUMN updated_at TYPE timestamptz USING updated_at AT TIME ZONE 'UTC',
  ALTER COLUMN finished_at TYPE timestamptz USING finished_at AT TIME ZONE 'UTC';
ALTER TABLE agent_runs
  ALTER COLUMN created_at SET DEFAULT now(),
  ALTER COLUMN updated_at SET DEFAULT now();

-- 2. The contract's names for what the platform already records, as generated columns: the
--    platform keeps writing user_id, thread_id and parent_run_id, and the database keeps the
--    contract's columns equal to them (a generated column cannot be written, so they cannot drift).
--    The runtime scope is the thread: one sandbox per conversation, as the provisioner derives it.
--    A run with a parent is a subagent's; every other run is a root ('chat') and owns a cleanup.
ALTER TABLE agent_runs
  ADD COLUMN uid text GENERATED ALWAYS AS (user_id) STORED,
  ADD COLUMN conversation_thread_id text GENERATED ALWAYS AS (thread_id) STORED,
  ADD COLUMN runtime_scope_id text GENERATED ALWAYS AS (thread_id) STORED,
  ADD COLUMN created_by_run_id text GENERATED ALWAYS AS (parent_run_id) STORED,
  ADD COLUMN run_type text GENERATED ALWAYS AS (
    CASE WHEN parent_run_id IS NULL THEN 'chat' ELSE 'subagent' END) STORED;

-- 3. The contract's columns the platform has no counterpart for. conversation_id stays NULL: the
--    cleanup then finds the conversation by thread id. worker_id and the lease are only shown by
--    `npm run ops -- explain`. runtime_cleanup_pending is the fence: false on every existing row, so
--    the runs that finished before the cut-over are never cleaned up by this project.
ALTER TABLE agent_runs
  ADD COLUMN conversation_id bigint,
  ADD COLUMN worker_id text,
  ADD COLUMN heartbeat_at timestamptz,
  ADD COLUMN lease_expires_at timestamptz,
  ADD COLUMN runtime_cleanup_pending boolean NOT NULL DEFAULT false;

-- 4. The conversation, as the cleanup reads it (the run's uid must be the conversation's, and the
--    Workdir is part of the identity a cleanup re-checks before it clears the fence). A view: the
--    platform's threads stay the one record of a conversation. The cleanup only reads it.
CREATE VIEW conversations AS
  SELECT NULL::bigint AS id, t.user_id AS uid, t.id AS thread_id,
         'projects/' || t.project_id::text AS workdir_path
  FROM threads t;

COMMIT;
