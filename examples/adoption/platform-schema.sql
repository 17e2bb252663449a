-- The worked example of docs/adopting.md: an agent platform's own tables before it adopts
-- runtime-cleanup, as a FastAPI service and an arq worker wrote them. Nothing here is the
-- contract's: the user is `user_id`, the conversation `thread_id`, the times are naive
-- (`timestamp without time zone`, written in UTC), there is no `sandbox_runtimes`, and a sandbox's
-- id is derived from its thread (`sbx-` and the first 12 hex digits of sha256(thread id)).
-- test/integration/adopt-platform-schema.test.ts starts from exactly this file.
CREATE TABLE threads (
  id          text PRIMARY KEY,
  user_id     text NOT NULL,
  project_id  uuid NOT NULL,            -- the agent's working directory is projects/<project_id>
  title       text,
  created_at  timestamp without time zone NOT NULL DEFAULT (now() AT TIME ZONE 'utc')
);

CREATE TABLE agent_runs (
  id             text PRIMARY KEY,      -- str(uuid4()), made by the API
  user_id        text NOT NULL,
  thread_id      text NOT NULL REFERENCES threads (id),
  parent_run_id  text REFERENCES agent_runs (id),   -- set for a subagent's run
  status         text NOT NULL DEFAULT 'pending',   -- pending, running, completed, failed, cancelled
  arq_job_id     text,
  error          text,
  created_at     timestamp without time zone NOT NULL DEFAULT (now() AT TIME ZONE 'utc'),
  updated_at     timestamp without time zone NOT NULL DEFAULT (now() AT TIME ZONE 'utc'),
  finished_at    timestamp without time zone
);

CREATE INDEX agent_runs_by_thread ON agent_runs (thread_id, created_at);
