-- Reclaiming leaked sandboxes (issue 13): the bookkeeping of what the reclaimer saw, and the guard
-- of its DELETE.
--
-- The fence protocol deletes a sandbox the database knows about. A sandbox leaks where the database
-- never learnt of it (the platform crashed between POST /api/sandboxes and recording it) or stopped
-- caring (a forced clear whose printed DELETE was never sent; a provisioner that kept a sandbox after
-- answering 404). The reclaimer lists the provisioner's live sandboxes and deletes those no scope
-- owns, like Kubernetes' garbage collector deletes what has no live owner, never by idle time alone.
--
-- runtime_reclaim_sightings: one row per listed sandbox that looked leaked on every listing since
--   first_seen_at (a listing that finds it owned, or does not list it, deletes the row: the streak
--   starts again). A sandbox is reclaimed only once first_seen_at is at least RECLAIM_GRACE_SECONDS
--   old, i.e. it stayed leaked on two consecutive listings at least the grace apart: a sandbox
--   created a moment ago, before the platform recorded it, is never deleted.
-- listed_identity: what the listing entry said that changes when the container is created again
--   under the same id (sandbox_url, created_at): a change restarts the streak like a new generation.
-- reclaim_in_flight_until / _token: set by the reclaim guard (runtime_cleanup_begin_reclaim) when
--   it lets a DELETE through, so a platform recording this sandbox id meanwhile is refused (trigger
--   below) until the DELETE has been answered (the row is then deleted) or the deadline passed.
CREATE TABLE IF NOT EXISTS runtime_reclaim_sightings (
  sandbox_id               text PRIMARY KEY,
  listed_generation        bigint,
  listed_identity          text,
  first_seen_at            timestamptz NOT NULL DEFAULT now(),
  last_seen_at             timestamptz NOT NULL DEFAULT now(),
  reclaim_in_flight_until  timestamptz,
  reclaim_in_flight_token  text
);

-- runtime_reclaim_tombstones: one row per sandbox id whose reclaim DELETE was confirmed, kept until
--   expires_at (the grace after the confirmation; rows past it are deleted by the next confirmation).
--   The platform's admission is "admit under the scope lock, POST, record": between its POST and its
--   record no row names the sandbox, and the provisioner's POST hands a live container with that id
--   out again. A reclaim answered in that window deleted the container the run is about to record;
--   the trigger below refuses that record (55006), so the platform POSTs again and gets a fresh one.
--   reclaimed_generation: the generation deleted; NULL when it was not known (then any record of the
--   id is refused until expires_at, since nothing tells the fresh container from the deleted one).
CREATE TABLE IF NOT EXISTS runtime_reclaim_tombstones (
  sandbox_id            text PRIMARY KEY,
  reclaimed_generation  bigint,
  reclaimed_at          timestamptz NOT NULL DEFAULT now(),
  expires_at            timestamptz NOT NULL
);

-- The reclaim guard (runtime_cleanup_begin_reclaim), its scope hold (runtime_reclaim_scope_hold,
-- runtime_reclaim_scope_last_activity), its lock key (runtime_reclaim_lock_key) and the trigger
-- function below (sandbox_runtimes_refuse_reclaimed) live in infra/sql/.

-- A platform recording a sandbox id while a reclaim DELETE of it may still act, or a generation a
-- confirmed reclaim deleted, is refused (SQLSTATE 55006).
DROP TRIGGER IF EXISTS sandbox_runtimes_refuse_reclaimed ON sandbox_runtimes;
CREATE TRIGGER sandbox_runtimes_refuse_reclaimed
  BEFORE INSERT OR UPDATE ON sandbox_runtimes
  FOR EACH ROW EXECUTE FUNCTION sandbox_runtimes_refuse_reclaimed();

-- The classification reads sandbox_runtimes by sandbox id (the primary key is by scope).
CREATE INDEX IF NOT EXISTS sandbox_runtimes_by_sandbox ON sandbox_runtimes (sandbox_id);
CREATE INDEX IF NOT EXISTS sandbox_runtimes_by_in_flight_sandbox ON sandbox_runtimes (delete_in_flight_sandbox_id)
  WHERE delete_in_flight_sandbox_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runtime_cleanup_overrides_by_scope ON runtime_cleanup_overrides (uid, runtime_scope_id);
-- A scope's last activity reads all its runs, terminal ones included (agent_runs_active_by_scope
-- holds only live ones). Without this, classifying a listing scanned agent_runs once per listed
-- sandbox: 148 s for 5 000 sandboxes over 200 000 runs, 1.2 s with it. On a very large table
-- create it beforehand with CREATE INDEX CONCURRENTLY under this name (see 006).
CREATE INDEX IF NOT EXISTS agent_runs_by_scope ON agent_runs (uid, runtime_scope_id);
