-- The reclaimer held to the release path's safety (issue 21).
--
-- 1. Settings of record. The reclaim guard trusted the grace and the delete-in-flight hold its
--    caller passed, so `ops reclaim --yes` run from an operator's shell with the defaults acted
--    against a stage that had raised RECLAIM_GRACE_SECONDS or the delete timeout. The deployed
--    reclaimer now records its settings here at every run, and the guard (and the end of an
--    attempt) never uses less than what is recorded, whoever calls it.
CREATE TABLE IF NOT EXISTS runtime_cleanup_settings (
  name         text PRIMARY KEY,
  value        double precision NOT NULL CHECK (value >= 0),
  recorded_at  timestamptz NOT NULL DEFAULT now(),
  recorded_by  text NOT NULL CHECK (length(btrim(recorded_by)) BETWEEN 1 AND 200)
);

-- 2. Pairing evidence. The reclaimer's brakes refused a listing in which no sandbox was named by
--    any row, or more than RECLAIM_MAX_SHARE_PERCENT looked leaked: right for a database paired
--    with the wrong provisioner, but also every listing of a quiet fleet, whose only live
--    sandboxes are leaks. Evidence that this database and this provisioner belong together now
--    survives a quiet night: one row per provisioner (its base URL without credentials), the last
--    time one of its listings was healthy (within the share, naming sandboxes rows here name).
CREATE TABLE IF NOT EXISTS runtime_reclaim_pairings (
  provisioner   text PRIMARY KEY,
  confirmed_at  timestamptz NOT NULL,
  evidence      text NOT NULL
);

-- 3. The refusal is laid down before the DELETE, one row per attempt. A tombstone used to be
--    written only by the statement after a confirmed DELETE: when that statement failed, a late
--    record of the deleted container was accepted once the in-flight deadline passed. The guard
--    now writes the attempt's tombstone itself (token = the attempt):
--      refuse_all_until       every record of the id is refused until then (the DELETE may act,
--                             and the platform's provisioner ignores generations): the hold;
--      reclaimed_generation   when the listing gave the generation: records of it or an older one
--                             are refused until expires_at (the grace), since a generation-aware
--                             provisioner gives a new container a newer one. NULL otherwise: then
--                             nothing is refused after the hold, so a conversation whose sandbox
--                             id is deterministic gets a new sandbox a few minutes later, not a
--                             grace later.
--    The end of the attempt keeps the row (confirmed), cuts refuse_all_until to the residual window
--    (the DELETE may still act), or deletes it (answered without deleting, or never sent).
ALTER TABLE runtime_reclaim_tombstones
  ADD COLUMN IF NOT EXISTS refuse_all_until timestamptz,
  ADD COLUMN IF NOT EXISTS token text;
-- An old row without a generation refused every record until expires_at: the same, said anew.
UPDATE runtime_reclaim_tombstones SET refuse_all_until = expires_at
  WHERE reclaimed_generation IS NULL AND refuse_all_until IS NULL;
UPDATE runtime_reclaim_tombstones SET token = 'before-011:' || sandbox_id WHERE token IS NULL;
ALTER TABLE runtime_reclaim_tombstones ALTER COLUMN token SET NOT NULL;
ALTER TABLE runtime_reclaim_tombstones DROP CONSTRAINT IF EXISTS runtime_reclaim_tombstones_pkey;
ALTER TABLE runtime_reclaim_tombstones ADD PRIMARY KEY (sandbox_id, token);

-- The end of a delete finds its records by the attempt's token (release and reclaim alike).
CREATE INDEX IF NOT EXISTS sandbox_runtimes_by_delete_in_flight_token ON sandbox_runtimes (delete_in_flight_token)
  WHERE delete_in_flight_token IS NOT NULL;

-- The reclaim guard's signature changes (whether the generation was listed, settings of record).
DROP FUNCTION IF EXISTS runtime_cleanup_begin_reclaim(text, bigint, double precision, double precision, text, integer);

-- The settings a caller's values may not go below: the larger of the two, per setting.
CREATE OR REPLACE FUNCTION runtime_cleanup_setting_of_record(p_name text, p_value double precision)
  RETURNS double precision
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT greatest(p_value, (SELECT s.value FROM runtime_cleanup_settings s WHERE s.name = p_name))
  $$;

-- Records the deployment's settings (p_by set: the deployed reclaimer, at every run) and returns
-- what is recorded. One statement; an operator's tool calls it with p_by NULL and only reads.
CREATE OR REPLACE FUNCTION runtime_cleanup_settings_of_record(p_settings jsonb, p_by text)
  RETURNS TABLE (name text, value double precision, recorded_at timestamptz, recorded_by text)
  LANGUAGE plpgsql VOLATILE
  AS $$
  BEGIN
    IF p_by IS NOT NULL THEN
      INSERT INTO runtime_cleanup_settings AS s (name, value, recorded_at, recorded_by)
      SELECT e.key, (e.value #>> '{}')::double precision, now(), p_by
      FROM jsonb_each(p_settings) AS e
      ON CONFLICT ON CONSTRAINT runtime_cleanup_settings_pkey DO UPDATE
        SET value = EXCLUDED.value, recorded_at = EXCLUDED.recorded_at, recorded_by = EXCLUDED.recorded_by;
    END IF;
    RETURN QUERY SELECT s.name, s.value, s.recorded_at, s.recorded_by FROM runtime_cleanup_settings s ORDER BY s.name;
  END
  $$;

-- Ends (or cuts) the delete-in-flight records one attempt wrote on sandbox_runtimes, matched by its
-- token: the one rule both deleters end their quarantine by (release: one row; reclaim: every row
-- that named the sandbox). p_residual_seconds NULL: the provisioner answered, or the DELETE was
-- never sent, so nothing of the attempt can act any more: the record falls back to p_floor_until
-- (an earlier attempt's deadline still running) or ends. Set: the DELETE may still act, so the
-- record is cut to now + that long, never below the floor and never past its own deadline.
CREATE OR REPLACE FUNCTION runtime_cleanup_end_delete_in_flight(
  p_token text, p_floor_until timestamptz, p_residual_seconds double precision
) RETURNS TABLE (uid text, runtime_scope_id text, until timestamptz)
  LANGUAGE sql VOLATILE
  AS $$
    WITH mine AS (
      SELECT s.uid, s.runtime_scope_id,
             CASE
               WHEN p_residual_seconds IS NULL
                 THEN CASE WHEN p_floor_until > clock_timestamp() THEN p_floor_until END
               ELSE least(s.delete_in_flight_until,
                          greatest(p_floor_until, clock_timestamp() + make_interval(secs => p_residual_seconds)))
             END AS until
      FROM sandbox_runtimes s
      WHERE s.delete_in_flight_token = p_token
      FOR UPDATE
    )
    UPDATE sandbox_runtimes s
    SET delete_in_flight_until = mine.until,
        delete_in_flight_token = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_token END,
        delete_in_flight_run_id = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_run_id END,
        delete_in_flight_sandbox_id = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_sandbox_id END,
        delete_in_flight_generation = CASE WHEN mine.until IS NULL THEN NULL ELSE s.delete_in_flight_generation END
    FROM mine
    WHERE s.uid = mine.uid AND s.runtime_scope_id = mine.runtime_scope_id
    RETURNING mine.uid, mine.runtime_scope_id, mine.until
  $$;

-- The reclaim guard (009), now: READ COMMITTED enforced like every decision (a snapshot taken
-- before its locks would miss a run the platform admitted while the guard waited for the scope's
-- lock); the grace and the hold never below the settings of record; and the attempt's tombstone
-- written here, before the DELETE, so no failure after the DELETE can leave the deleted container
-- recordable.
--
-- Verdicts: see 009 (not_sighted, owner_changed, delete_in_flight, the scope holds, proceed).
-- p_generation: the generation the DELETE names; p_generation_listed: the listing gave it (only
-- then is a record of that generation known to name the deleted container after the hold).
CREATE OR REPLACE FUNCTION runtime_cleanup_begin_reclaim(
  p_sandbox_id text,
  p_generation bigint,
  p_generation_listed boolean,
  p_grace_seconds double precision,
  p_hold_seconds double precision,
  p_token text,
  p_lock_timeout_ms integer
) RETURNS TABLE (verdict text, uid text, runtime_scope_id text, in_flight_until timestamptz,
                 grace_seconds double precision, hold_seconds double precision)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    locked text[] := ARRAY[]::text[];
    owner record;
    hold text;
    grace double precision;
    hold_for double precision;
    new_until timestamptz;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    grace := runtime_cleanup_setting_of_record('reclaim_grace_seconds', p_grace_seconds);
    hold_for := runtime_cleanup_setting_of_record('reclaim_hold_seconds', p_hold_seconds);

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
      RETURN QUERY SELECT 'owner_changed'::text, NULL::text, NULL::text, NULL::timestamptz, grace, hold_for;
      RETURN;
    END IF;

    PERFORM 1 FROM runtime_reclaim_sightings g
      WHERE g.sandbox_id = p_sandbox_id
        AND g.first_seen_at <= clock_timestamp() - make_interval(secs => grace)
      FOR UPDATE;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'not_sighted'::text, NULL::text, NULL::text, NULL::timestamptz, grace, hold_for;
      RETURN;
    END IF;
    -- Another reclaim's DELETE of this id may still act (the schedule and `ops reclaim --yes`, or
    -- two invocations): its record is never overwritten, so its end cannot clear this one's, nor
    -- this one's end clear its.
    IF EXISTS (SELECT 1 FROM runtime_reclaim_sightings g
               WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_until > clock_timestamp()) THEN
      RETURN QUERY SELECT 'delete_in_flight'::text, NULL::text, NULL::text, NULL::timestamptz, grace, hold_for;
      RETURN;
    END IF;

    FOR owner IN
      SELECT s.uid, s.runtime_scope_id FROM sandbox_runtimes s
      WHERE s.sandbox_id = p_sandbox_id OR s.delete_in_flight_sandbox_id = p_sandbox_id
      ORDER BY s.uid, s.runtime_scope_id
    LOOP
      hold := runtime_reclaim_scope_hold(owner.uid, owner.runtime_scope_id, grace);
      IF hold IS NOT NULL THEN
        RETURN QUERY SELECT hold, owner.uid, owner.runtime_scope_id, NULL::timestamptz, grace, hold_for;
        RETURN;
      END IF;
    END LOOP;

    new_until := clock_timestamp() + make_interval(secs => hold_for);
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
    DELETE FROM runtime_reclaim_tombstones t
      WHERE greatest(t.expires_at, t.refuse_all_until) <= clock_timestamp();
    INSERT INTO runtime_reclaim_tombstones (sandbox_id, token, reclaimed_generation, reclaimed_at, refuse_all_until, expires_at)
      VALUES (p_sandbox_id, p_token,
              CASE WHEN p_generation_listed THEN p_generation END,
              now(), new_until,
              CASE WHEN p_generation_listed
                   THEN greatest(new_until, clock_timestamp() + make_interval(secs => grace))
                   ELSE new_until END);
    RETURN QUERY SELECT 'proceed'::text, NULL::text, NULL::text, new_until, grace, hold_for;
  END
  $$;

-- The end of one reclaim attempt, in one statement, so a crash in between leaves no half-ended
-- record. p_ending:
--   confirmed      the provisioner confirmed the sandbox gone: the rows that named this
--                  generation are marked released (with its sandbox id and generation, as
--                  finalize marks them), the sighting goes, the tombstone stays as the guard laid
--                  it (with a listed generation, only that generation and older ones stay
--                  refused: a fresh container records at once);
--                  with p_residual_seconds set (an earlier request of the attempt went unanswered
--                  and may still act) the scopes' records and the tombstone are cut to it;
--   may_still_act  the DELETE may still act (no answer, 5xx, 202, a reset): every record of the
--                  attempt is cut to now + p_residual_seconds (never below the residual of record)
--                  and left to expire;
--   answered       the provisioner answered without deleting (a 4xx, an unconfirming 409), or
--   not_sent       the DELETE never left: every record of the attempt ends now.
CREATE OR REPLACE FUNCTION runtime_cleanup_end_reclaim(
  p_token text,
  p_sandbox_id text,
  p_generation bigint,
  p_ending text,
  p_residual_seconds double precision
) RETURNS TABLE (rows_ended integer, sighting text, tombstone text)
  LANGUAGE plpgsql VOLATILE
  AS $$
  DECLARE
    residual double precision;
    ended integer;
  BEGIN
    IF p_ending NOT IN ('confirmed', 'may_still_act', 'answered', 'not_sent') THEN
      RAISE EXCEPTION 'runtime_cleanup_end_reclaim: unknown ending %', p_ending USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_ending = 'may_still_act' AND p_residual_seconds IS NULL THEN
      RAISE EXCEPTION 'runtime_cleanup_end_reclaim: may_still_act needs its residual window' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    residual := CASE WHEN p_ending IN ('may_still_act', 'confirmed') AND p_residual_seconds IS NOT NULL
                     THEN runtime_cleanup_setting_of_record('reclaim_residual_seconds', p_residual_seconds) END;
    IF p_ending = 'confirmed' THEN
      UPDATE sandbox_runtimes s
        SET released_at = now(), released_sandbox_id = s.sandbox_id, released_generation = s.generation
        WHERE s.delete_in_flight_token = p_token AND s.sandbox_id = p_sandbox_id AND s.generation = p_generation
          AND NOT runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                                      s.sandbox_id, s.generation);
    END IF;
    SELECT count(*)::int INTO ended FROM runtime_cleanup_end_delete_in_flight(p_token, NULL, residual);

    IF p_ending = 'confirmed' THEN
      DELETE FROM runtime_reclaim_sightings g WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_token = p_token;
      sighting := 'gone';
      tombstone := 'kept';
      -- Once the DELETE is confirmed, a fresh container may be recorded at once (the deleted one,
      -- and older ones, stay refused by generation) only where the listing gave the generation:
      -- it tells the deleted container from any later one. Without it nothing does, whether or not
      -- a scope named the sandbox: another scope of the same conversation, which derives the same
      -- id and was never blocked by this attempt's records, may have POSTed during the DELETE and
      -- been handed the very container deleted. So its refusal runs to the hold's end (the delete
      -- window plus margin): minutes, not the grace.
      IF EXISTS (SELECT 1 FROM runtime_reclaim_tombstones t
                 WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token
                   AND t.reclaimed_generation IS NOT NULL) THEN
        UPDATE runtime_reclaim_tombstones t
          SET refuse_all_until = CASE WHEN residual IS NULL THEN clock_timestamp()
                                      ELSE least(t.refuse_all_until, clock_timestamp() + make_interval(secs => residual)) END
          WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token;
        tombstone := 'kept for the generation';
      END IF;
    ELSIF p_ending = 'may_still_act' THEN
      UPDATE runtime_reclaim_sightings g
        SET reclaim_in_flight_until = least(g.reclaim_in_flight_until, clock_timestamp() + make_interval(secs => residual))
        WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_token = p_token;
      UPDATE runtime_reclaim_tombstones t
        SET refuse_all_until = least(t.refuse_all_until, clock_timestamp() + make_interval(secs => residual))
        WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token;
      sighting := 'quarantined';
      tombstone := 'cut';
    ELSE
      UPDATE runtime_reclaim_sightings g
        SET reclaim_in_flight_until = NULL, reclaim_in_flight_token = NULL
        WHERE g.sandbox_id = p_sandbox_id AND g.reclaim_in_flight_token = p_token;
      DELETE FROM runtime_reclaim_tombstones t WHERE t.sandbox_id = p_sandbox_id AND t.token = p_token;
      sighting := 'kept';
      tombstone := 'gone';
    END IF;
    DELETE FROM runtime_reclaim_tombstones t WHERE greatest(t.expires_at, t.refuse_all_until) <= clock_timestamp();
    rows_ended := ended;
    RETURN NEXT;
  END
  $$;

-- A platform recording a sandbox id (a new row, or a row changing to that id or generation) while
-- a reclaim of that id may still act, or of a generation a confirmed reclaim deleted, is refused
-- (see 009 and the tombstones above): the platform's provisioner hands a live container out again
-- on POST, so the run would get the very sandbox the DELETE is removing. The error names the
-- sandbox and the deadline; the platform's acquisition fails and it retries after.
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
      SELECT max(greatest(g.reclaim_in_flight_until, t.refuse_all_until)) INTO until
        FROM (SELECT NEW.sandbox_id AS sandbox_id) n
        LEFT JOIN runtime_reclaim_sightings g
          ON g.sandbox_id = n.sandbox_id AND g.reclaim_in_flight_until > clock_timestamp()
        LEFT JOIN runtime_reclaim_tombstones t
          ON t.sandbox_id = n.sandbox_id AND t.refuse_all_until > clock_timestamp();
      IF until IS NOT NULL THEN
        RAISE EXCEPTION 'sandbox % is being reclaimed (a DELETE may act until %); create or record it again after that', NEW.sandbox_id, until
          USING ERRCODE = '55006';
      END IF;
      -- A confirmed reclaim deleted this id at a generation the provisioner listed: a record of
      -- it, or of a generation not newer, names a deleted container.
      SELECT max(t.expires_at) INTO until FROM runtime_reclaim_tombstones t
        WHERE t.sandbox_id = NEW.sandbox_id AND t.expires_at > clock_timestamp()
          AND t.reclaimed_generation IS NOT NULL AND NEW.generation <= t.reclaimed_generation;
      IF until IS NOT NULL THEN
        RAISE EXCEPTION 'sandbox % generation % was reclaimed (deleted); create it again (POST) and record the new generation (refused for generations up to the deleted one until %)', NEW.sandbox_id, NEW.generation, until
          USING ERRCODE = '55006';
      END IF;
    END IF;
    RETURN NEW;
  END
  $$;

-- The reclaim scope hold of 009 read a NULL status as neither active nor terminal (`status NOT IN
-- (…)` is NULL for it), unlike every phase function: a run whose status was not written yet let
-- its scope's sandbox be reclaimed. NULL counts as active here too.
CREATE OR REPLACE FUNCTION runtime_reclaim_scope_hold(p_uid text, p_runtime_scope_id text, p_grace_seconds double precision)
  RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT CASE
      WHEN EXISTS (SELECT 1 FROM agent_runs a
                   WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id
                     AND (a.status NOT IN ('completed', 'failed', 'cancelled', 'interrupted') OR a.status IS NULL))
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
