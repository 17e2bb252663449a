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
-- reclaim_in_flight_until / _token: set by the guard below when it lets a DELETE through, so a
--   platform recording this sandbox id meanwhile is refused (trigger below) until the DELETE has
--   been answered (the row is then deleted) or the deadline passed.
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

-- The advisory lock that serialises the reclaim guard of one sandbox id with any write that makes a
-- scope name that id (the trigger below). A separate key space from runtime_cleanup_lock_key.
CREATE OR REPLACE FUNCTION runtime_reclaim_lock_key(sandbox_id text) RETURNS bigint
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$ SELECT hashtextextended('reclaim:' || sandbox_id, 0) $$;

-- When a scope was last active: its runs' creation, update and finish, and forced clears of its
-- fences. -infinity when nothing is known (a row recorded without runs).
CREATE OR REPLACE FUNCTION runtime_reclaim_scope_last_activity(p_uid text, p_runtime_scope_id text)
  RETURNS timestamptz
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT coalesce(greatest(
      (SELECT max(greatest(r.created_at, r.updated_at, r.finished_at)) FROM agent_runs r
        WHERE r.uid = p_uid AND r.runtime_scope_id = p_runtime_scope_id),
      (SELECT max(o.forced_at) FROM runtime_cleanup_overrides o
        WHERE o.uid = p_uid AND o.runtime_scope_id = p_runtime_scope_id)
    ), '-infinity'::timestamptz)
  $$;

-- Why a scope keeps a sandbox it names, or NULL when it does not (at the caller's snapshot):
--   scope_active      a non-terminal run (any status that is not a known terminal one)
--   scope_fenced      a root run's fence is up: its cleanup owns the delete
--   delete_in_flight  a release's (or another reclaim's) DELETE may still act
--   scope_recent      active less than p_grace_seconds ago
CREATE OR REPLACE FUNCTION runtime_reclaim_scope_hold(p_uid text, p_runtime_scope_id text, p_grace_seconds double precision)
  RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT CASE
      WHEN EXISTS (SELECT 1 FROM agent_runs a
                   WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id
                     AND a.status NOT IN ('completed', 'failed', 'cancelled', 'interrupted'))
        THEN 'scope_active'
      WHEN EXISTS (SELECT 1 FROM agent_runs a
                   WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id
                     AND a.runtime_cleanup_pending AND a.run_type <> 'subagent')
        THEN 'scope_fenced'
      WHEN EXISTS (SELECT 1 FROM sandbox_runtimes s
                   WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
                     AND s.delete_in_flight_until > clock_timestamp())
        THEN 'delete_in_flight'
      WHEN runtime_reclaim_scope_last_activity(p_uid, p_runtime_scope_id)
           > clock_timestamp() - make_interval(secs => p_grace_seconds)
        THEN 'scope_recent'
    END
  $$;

-- The reclaim guard, modelled on runtime_cleanup_begin_release (004): called as ONE autocommit
-- statement just before each reclaim DELETE; it takes the advisory lock of every scope whose row
-- names the sandbox (in key order, so two guards never deadlock) and then the sandbox id's own
-- reclaim lock, re-reads under them (plpgsql: each statement a fresh READ COMMITTED snapshot, so
-- what a platform admission or a forced clear committed before us is seen), and either refuses or
-- records the delete in flight:
--   * on every naming scope's sandbox_runtimes row (delete_in_flight_*): runtime_cleanup_blocked
--     then refuses admission and force-clear refuses, exactly as for a release;
--   * on the sighting (reclaim_in_flight_until): the trigger below refuses a platform recording
--     this sandbox id for a scope that did not name it before.
-- The locks end with the statement, never held across the DELETE.
--
-- Verdicts:
--   not_sighted       the sighting is gone or younger than the grace (another reclaimer acted, or
--                     a listing found it owned meanwhile)
--   owner_changed     a scope started naming the sandbox between the locks (try next run)
--   delete_in_flight  (also) another reclaim's DELETE of this id may still act: its deadline is open
--   scope_active | scope_fenced | delete_in_flight | scope_recent   (runtime_reclaim_scope_hold)
--   proceed           the DELETE may be sent; in_flight_until says until when it may act
--
-- p_generation: the generation the DELETE will name (recorded on the rows for operators).
CREATE OR REPLACE FUNCTION runtime_cleanup_begin_reclaim(
  p_sandbox_id text,
  p_generation bigint,
  p_grace_seconds double precision,
  p_hold_seconds double precision,
  p_token text,
  p_lock_timeout_ms integer
) RETURNS TABLE (verdict text, uid text, runtime_scope_id text, in_flight_until timestamptz)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    locked text[] := ARRAY[]::text[];
    owner record;
    hold text;
    new_until timestamptz;
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);

    FOR owner IN
      SELECT s.uid, s.runtime_scope_id FROM sandbox_runtimes s
      WHERE s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id
      ORDER BY runtime_cleanup_lock_key(s.uid, s.runtime_scope_id), s.uid, s.runtime_scope_id
    LOOP
      PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(owner.uid, owner.runtime_scope_id));
      locked := locked || (length(owner.uid)::text || ':' || owner.uid || ':' || owner.runtime_scope_id);
    END LOOP;
    PERFORM pg_advisory_xact_lock(runtime_reclaim_lock_key(p_sandbox_id));

    IF EXISTS (
      SELECT 1 FROM sandbox_runtimes s
      WHERE (s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id)
        AND NOT ((length(s.uid)::text || ':' || s.uid || ':' || s.runtime_scope_id) = ANY (locked))
    ) THEN
      RETURN QUERY SELECT 'owner_changed'::text, NULL::text, NULL::text, NULL::timestamptz;
      RETURN;
    END IF;

    PERFORM 1 FROM runtime_reclaim_sightings g
      WHERE g.sandbox_id = p_sandbox_id
        AND g.first_seen_at <= clock_timestamp() - make_interval(secs => p_grace_seconds)
      FOR UPDATE;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'not_sighted'::text, NULL::text, NULL::text, NULL::timestamptz;
      RETURN;
    END IF;
    -- Another reclaim's DELETE of this id may still act (the schedule and `ops reclaim --yes`, or
    -- two invocations): its record is never overwritten, so its end cannot clear this one's, nor
    -- this one's end clear its.
    IF EXISTS (SELECT 1 FROM runtime_reclaim_sightings g
               WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_until > clock_timestamp()) THEN
      RETURN QUERY SELECT 'delete_in_flight'::text, NULL::text, NULL::text, NULL::timestamptz;
      RETURN;
    END IF;

    FOR owner IN
      SELECT s.uid, s.runtime_scope_id FROM sandbox_runtimes s
      WHERE s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id
      ORDER BY s.uid, s.runtime_scope_id
    LOOP
      hold := runtime_reclaim_scope_hold(owner.uid, owner.runtime_scope_id, p_grace_seconds);
      IF hold IS NOT NULL THEN
        RETURN QUERY SELECT hold, owner.uid, owner.runtime_scope_id, NULL::timestamptz;
        RETURN;
      END IF;
    END LOOP;

    new_until := clock_timestamp() + make_interval(secs => p_hold_seconds);
    UPDATE sandbox_runtimes s
      SET delete_in_flight_until = greatest(new_until, s.delete_in_flight_until),
          delete_in_flight_token = p_token,
          delete_in_flight_run_id = NULL,
          delete_in_flight_sandbox_id = p_sandbox_id,
          delete_in_flight_generation = p_generation
      WHERE s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id;
    UPDATE runtime_reclaim_sightings g
      SET reclaim_in_flight_until = new_until, reclaim_in_flight_token = p_token
      WHERE g.sandbox_id = p_sandbox_id;
    RETURN QUERY SELECT 'proceed'::text, NULL::text, NULL::text, new_until;
  END
  $$;

-- A platform recording a sandbox id (a new row, or a row changing to that id or generation) while
-- a reclaim DELETE of that id may still act, or a generation a confirmed reclaim deleted (the
-- tombstones above), is refused: the platform's provisioner hands a live
-- container out again on POST, so the run would get the very sandbox the DELETE is removing. The
-- error names the sandbox and the deadline; the platform's acquisition fails and it retries after.
-- The lock makes the check and the guard's record strictly ordered.
CREATE OR REPLACE FUNCTION sandbox_runtimes_refuse_reclaimed() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
  DECLARE
    until timestamptz;
  BEGIN
    IF TG_OP = 'INSERT'
       OR NEW.sandbox_id IS DISTINCT FROM OLD.sandbox_id
       OR NEW.generation IS DISTINCT FROM OLD.generation THEN
      -- The lock only where a reclaim can be at work: an id with a sighting. Without one, no guard
      -- can act on it for a whole grace (it needs a sighting that old), by when this row is
      -- committed and the guard sees its owner. Locking every row instead took one advisory lock per
      -- id: a bulk upsert of 50 k sandboxes ran out of shared memory (max_locks_per_transaction).
      IF EXISTS (SELECT 1 FROM runtime_reclaim_sightings g WHERE g.sandbox_id = NEW.sandbox_id) THEN
        PERFORM pg_advisory_xact_lock(runtime_reclaim_lock_key(NEW.sandbox_id));
      END IF;
      SELECT g.reclaim_in_flight_until INTO until FROM runtime_reclaim_sightings g
        WHERE g.sandbox_id = NEW.sandbox_id AND g.reclaim_in_flight_until > clock_timestamp();
      IF FOUND THEN
        RAISE EXCEPTION 'sandbox % is being reclaimed (a DELETE may act until %); create or record it again after that', NEW.sandbox_id, until
          USING ERRCODE = '55006';
      END IF;
      -- A confirmed reclaim deleted this id (at most this generation): a record of it, or of a
      -- generation not newer, names a deleted container (handed out by a POST before the DELETE).
      SELECT t.expires_at INTO until FROM runtime_reclaim_tombstones t
        WHERE t.sandbox_id = NEW.sandbox_id AND t.expires_at > clock_timestamp()
          AND (t.reclaimed_generation IS NULL OR NEW.generation <= t.reclaimed_generation);
      IF FOUND THEN
        RAISE EXCEPTION 'sandbox % generation % was reclaimed (deleted); create it again (POST) and record the new generation (refused for unknown generations until %)', NEW.sandbox_id, NEW.generation, until
          USING ERRCODE = '55006';
      END IF;
    END IF;
    RETURN NEW;
  END
  $$;

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
