-- The schema `npm run migrate` builds (infra/sql/ and infra/migrations/), read from the catalog
-- of a freshly migrated database by `npm run schema:dump` (infra/schema-dump.ts). Generated: do
-- not edit; test/integration/schema-dump.test.ts fails when it and a migrated database differ.
-- Each function's why-comments are in its file under infra/sql/.

CREATE TABLE agent_runs (
  id text NOT NULL,
  uid text NOT NULL,
  conversation_id bigint,
  conversation_thread_id text NOT NULL,
  runtime_scope_id text NOT NULL,
  run_type text NOT NULL DEFAULT 'chat'::text,
  created_by_run_id text,
  status text NOT NULL,
  runtime_cleanup_pending boolean NOT NULL DEFAULT false,
  worker_id text,
  heartbeat_at timestamp with time zone,
  lease_expires_at timestamp with time zone,
  finished_at timestamp with time zone,
  created_at timestamp with time zone NOT NULL DEFAULT now(),
  updated_at timestamp with time zone NOT NULL DEFAULT now(),
  runtime_cleanup_pending_since timestamp with time zone,
  runtime_cleanup_announced_at timestamp with time zone
);

CREATE TABLE conversations (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  uid text NOT NULL,
  thread_id text NOT NULL,
  workdir_path text NOT NULL
);

CREATE TABLE runtime_cleanup_overrides (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  run_id text NOT NULL,
  uid text NOT NULL,
  runtime_scope_id text NOT NULL,
  sandbox_id text,
  generation bigint,
  fence_set_at timestamp with time zone,
  reason text NOT NULL,
  actor text NOT NULL,
  forced_at timestamp with time zone NOT NULL DEFAULT now(),
  metric_reported_at timestamp with time zone
);

CREATE TABLE runtime_cleanup_settings (
  name text NOT NULL,
  value double precision NOT NULL,
  recorded_at timestamp with time zone NOT NULL DEFAULT now(),
  recorded_by text NOT NULL
);

CREATE TABLE runtime_reclaim_pairings (
  provisioner text NOT NULL,
  confirmed_at timestamp with time zone NOT NULL,
  evidence text NOT NULL
);

CREATE TABLE runtime_reclaim_sightings (
  sandbox_id text NOT NULL,
  listed_generation bigint,
  listed_identity text,
  first_seen_at timestamp with time zone NOT NULL DEFAULT now(),
  last_seen_at timestamp with time zone NOT NULL DEFAULT now(),
  reclaim_in_flight_until timestamp with time zone,
  reclaim_in_flight_token text
);

CREATE TABLE runtime_reclaim_tombstones (
  sandbox_id text NOT NULL,
  reclaimed_generation bigint,
  reclaimed_at timestamp with time zone NOT NULL DEFAULT now(),
  expires_at timestamp with time zone NOT NULL,
  refuse_all_until timestamp with time zone,
  token text NOT NULL
);

CREATE TABLE sandbox_runtimes (
  uid text NOT NULL,
  runtime_scope_id text NOT NULL,
  sandbox_id text NOT NULL,
  generation bigint NOT NULL,
  released_at timestamp with time zone,
  delete_in_flight_until timestamp with time zone,
  delete_in_flight_token text,
  delete_in_flight_run_id text,
  delete_in_flight_sandbox_id text,
  delete_in_flight_generation bigint,
  released_sandbox_id text,
  released_generation bigint
);

CREATE TABLE schema_functions (
  name text NOT NULL,
  checksum text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE schema_migrations (
  version integer NOT NULL,
  name text NOT NULL,
  checksum text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now()
);

ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES conversations(id);
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_pkey PRIMARY KEY (id);
ALTER TABLE conversations ADD CONSTRAINT conversations_pkey PRIMARY KEY (id);
ALTER TABLE conversations ADD CONSTRAINT conversations_thread_id_key UNIQUE (thread_id);
ALTER TABLE runtime_cleanup_overrides ADD CONSTRAINT runtime_cleanup_overrides_actor_check CHECK (((length(btrim(actor)) >= 1) AND (length(btrim(actor)) <= 128)));
ALTER TABLE runtime_cleanup_overrides ADD CONSTRAINT runtime_cleanup_overrides_pkey PRIMARY KEY (id);
ALTER TABLE runtime_cleanup_overrides ADD CONSTRAINT runtime_cleanup_overrides_reason_check CHECK (((length(btrim(reason)) >= 1) AND (length(btrim(reason)) <= 500)));
ALTER TABLE runtime_cleanup_settings ADD CONSTRAINT runtime_cleanup_settings_pkey PRIMARY KEY (name);
ALTER TABLE runtime_cleanup_settings ADD CONSTRAINT runtime_cleanup_settings_recorded_by_check CHECK (((length(btrim(recorded_by)) >= 1) AND (length(btrim(recorded_by)) <= 200)));
ALTER TABLE runtime_cleanup_settings ADD CONSTRAINT runtime_cleanup_settings_value_check CHECK ((value >= (0)::double precision));
ALTER TABLE runtime_reclaim_pairings ADD CONSTRAINT runtime_reclaim_pairings_pkey PRIMARY KEY (provisioner);
ALTER TABLE runtime_reclaim_sightings ADD CONSTRAINT runtime_reclaim_sightings_pkey PRIMARY KEY (sandbox_id);
ALTER TABLE runtime_reclaim_tombstones ADD CONSTRAINT runtime_reclaim_tombstones_pkey PRIMARY KEY (sandbox_id, token);
ALTER TABLE sandbox_runtimes ADD CONSTRAINT sandbox_runtimes_pkey PRIMARY KEY (uid, runtime_scope_id);
ALTER TABLE schema_functions ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (name);
ALTER TABLE schema_migrations ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

CREATE INDEX agent_runs_active_by_scope ON public.agent_runs USING btree (uid, runtime_scope_id) WHERE runtime_cleanup_status_is_active(status);
CREATE INDEX agent_runs_by_parent ON public.agent_runs USING btree (created_by_run_id) WHERE (created_by_run_id IS NOT NULL);
CREATE INDEX agent_runs_by_scope ON public.agent_runs USING btree (uid, runtime_scope_id);
CREATE INDEX agent_runs_fences_by_age ON public.agent_runs USING btree (COALESCE(runtime_cleanup_pending_since, finished_at, updated_at), id) WHERE (runtime_cleanup_pending AND (run_type <> 'subagent'::text));
CREATE INDEX agent_runs_fences_by_scope ON public.agent_runs USING btree (uid, runtime_scope_id) WHERE (runtime_cleanup_pending AND (run_type <> 'subagent'::text));
CREATE INDEX agent_runs_fences_due ON public.agent_runs USING btree (GREATEST(COALESCE(runtime_cleanup_pending_since, finished_at, updated_at), runtime_cleanup_announced_at)) WHERE (runtime_cleanup_pending AND (run_type <> 'subagent'::text));
CREATE INDEX runtime_cleanup_overrides_by_run ON public.runtime_cleanup_overrides USING btree (run_id);
CREATE INDEX runtime_cleanup_overrides_by_scope ON public.runtime_cleanup_overrides USING btree (uid, runtime_scope_id);
CREATE INDEX runtime_cleanup_overrides_by_time ON public.runtime_cleanup_overrides USING btree (forced_at DESC);
CREATE INDEX runtime_cleanup_overrides_unreported ON public.runtime_cleanup_overrides USING btree (id) WHERE (metric_reported_at IS NULL);
CREATE INDEX sandbox_runtimes_by_delete_in_flight_token ON public.sandbox_runtimes USING btree (delete_in_flight_token) WHERE (delete_in_flight_token IS NOT NULL);
CREATE INDEX sandbox_runtimes_by_in_flight_sandbox ON public.sandbox_runtimes USING btree (delete_in_flight_sandbox_id) WHERE (delete_in_flight_sandbox_id IS NOT NULL);
CREATE INDEX sandbox_runtimes_by_sandbox ON public.sandbox_runtimes USING btree (sandbox_id);

CREATE OR REPLACE FUNCTION public.agent_runs_track_fence()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
  BEGIN
    IF NEW.runtime_cleanup_pending AND (TG_OP = 'INSERT' OR NOT OLD.runtime_cleanup_pending) THEN
      NEW.runtime_cleanup_pending_since := clock_timestamp();
      NEW.runtime_cleanup_announced_at := NULL;
    ELSIF NOT NEW.runtime_cleanup_pending THEN
      NEW.runtime_cleanup_pending_since := NULL;
      NEW.runtime_cleanup_announced_at := NULL;
    END IF;
    RETURN NEW;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_active_run(p_uid text, p_runtime_scope_id text, p_run_id text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
  DECLARE
    active_id text;
  BEGIN
    SELECT a.id INTO active_id FROM agent_runs a
      WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id AND a.id <> p_run_id
        AND runtime_cleanup_status_is_active(a.status)
      ORDER BY a.id LIMIT 1;
    IF active_id IS NULL THEN
      SELECT d.id INTO active_id FROM runtime_cleanup_descendants(p_run_id) d
        WHERE runtime_cleanup_status_is_active(d.status)
        ORDER BY d.id LIMIT 1;
    END IF;
    RETURN active_id;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_begin_reclaim(p_sandbox_id text, p_generation bigint, p_generation_listed boolean, p_grace_seconds double precision, p_hold_seconds double precision, p_token text, p_lock_timeout_ms integer)
 RETURNS TABLE(verdict text, uid text, runtime_scope_id text, in_flight_until timestamp with time zone, grace_seconds double precision, hold_seconds double precision)
 LANGUAGE plpgsql
AS $function$
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
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_begin_release(p_run_id text, p_uid text, p_runtime_scope_id text, p_sandbox_id text, p_generation bigint, p_fence_set_at text, p_hold_seconds double precision, p_token text, p_lock_timeout_ms integer)
 RETURNS TABLE(verdict text, blocking_run_id text, in_flight_until timestamp with time zone, floor_until timestamp with time zone)
 LANGUAGE plpgsql
AS $function$
  DECLARE
    run record;
    sandbox record;
    active_id text;
    previous_until timestamptz;
    new_until timestamptz;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(p_uid, p_runtime_scope_id));

    SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
           r.runtime_cleanup_pending_since AS fence_set_at
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF run.uid IS DISTINCT FROM p_uid OR run.runtime_scope_id IS DISTINCT FROM p_runtime_scope_id THEN
      RETURN QUERY SELECT 'scope_mismatch'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF run.run_type = 'subagent' THEN
      RETURN QUERY SELECT 'run_not_root'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      RETURN QUERY SELECT 'run_not_terminal'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF run.runtime_cleanup_pending IS NOT TRUE OR run.fence_set_at IS DISTINCT FROM p_fence_set_at::timestamptz THEN
      RETURN QUERY SELECT 'fence_gone'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    active_id := runtime_cleanup_active_run(p_uid, p_runtime_scope_id, p_run_id);
    IF active_id IS NOT NULL THEN
      RETURN QUERY SELECT 'scope_active'::text, active_id, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    SELECT s.sandbox_id, s.generation, s.delete_in_flight_until, s.delete_in_flight_token,
           runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                               s.sandbox_id, s.generation) AS released
      INTO sandbox
      FROM sandbox_runtimes s
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
      FOR UPDATE;
    IF NOT FOUND OR sandbox.sandbox_id IS DISTINCT FROM p_sandbox_id OR sandbox.generation IS DISTINCT FROM p_generation THEN
      RETURN QUERY SELECT 'sandbox_mismatch'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;
    IF sandbox.released THEN
      RETURN QUERY SELECT 'already_released'::text, NULL::text, NULL::timestamptz, NULL::timestamptz;
      RETURN;
    END IF;

    previous_until := CASE WHEN sandbox.delete_in_flight_until > clock_timestamp()
                                AND sandbox.delete_in_flight_token IS DISTINCT FROM p_token
                           THEN sandbox.delete_in_flight_until END;
    new_until := greatest(clock_timestamp() + make_interval(secs => p_hold_seconds), previous_until);
    UPDATE sandbox_runtimes s
      SET delete_in_flight_until = new_until,
          delete_in_flight_token = p_token,
          delete_in_flight_run_id = p_run_id,
          delete_in_flight_sandbox_id = p_sandbox_id,
          delete_in_flight_generation = p_generation
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id;
    RETURN QUERY SELECT 'proceed'::text, NULL::text, new_until, previous_until;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_blocked(uid text, runtime_scope_id text)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE PARALLEL SAFE
AS $function$
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    RETURN EXISTS (
      SELECT 1 FROM agent_runs r
      WHERE r.uid = runtime_cleanup_blocked.uid
        AND r.runtime_scope_id = runtime_cleanup_blocked.runtime_scope_id
        AND r.run_type <> 'subagent'
        AND r.runtime_cleanup_pending
    ) OR EXISTS (
      SELECT 1 FROM sandbox_runtimes s
      WHERE s.uid = runtime_cleanup_blocked.uid
        AND s.runtime_scope_id = runtime_cleanup_blocked.runtime_scope_id
        AND s.delete_in_flight_until > now()
    );
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_descendants(p_run_id text)
 RETURNS TABLE(id text, status text, run_type text, runtime_scope_id text)
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    WITH RECURSIVE descendants AS (
      SELECT a.id, a.status, a.run_type, a.runtime_scope_id
      FROM agent_runs a WHERE a.created_by_run_id = p_run_id
      UNION
      SELECT a.id, a.status, a.run_type, a.runtime_scope_id
      FROM agent_runs a JOIN descendants d ON a.created_by_run_id = d.id
    )
    SELECT d.id, d.status, d.run_type, d.runtime_scope_id FROM descendants d
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_end_delete_in_flight(p_token text, p_floor_until timestamp with time zone, p_residual_seconds double precision)
 RETURNS TABLE(uid text, runtime_scope_id text, until timestamp with time zone)
 LANGUAGE sql
AS $function$
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
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_end_reclaim(p_token text, p_sandbox_id text, p_generation bigint, p_ending text, p_residual_seconds double precision)
 RETURNS TABLE(rows_ended integer, sighting text, tombstone text)
 LANGUAGE plpgsql
AS $function$
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
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_fence_check(p_run_id text)
 RETURNS TABLE(decision text, uid text, runtime_scope_id text, workdir_path text, sandbox_id text, generation bigint, fence_set_at text, blocking_run_id text)
 LANGUAGE plpgsql
AS $function$
  DECLARE
    run record;
    conv record;
    sandbox record;
    active_id text;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    IF NOT runtime_cleanup_lock_run(p_run_id) THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
           to_json(r.runtime_cleanup_pending_since) #>> '{}' AS fence_set_at, r.conversation_id, r.conversation_thread_id
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id;

    IF run.run_type = 'subagent' THEN
      RETURN QUERY SELECT 'not_owner'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    IF run.runtime_cleanup_pending IS NOT TRUE THEN
      RETURN QUERY SELECT 'already_clean'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    IF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      RETURN QUERY SELECT 'run_not_terminal'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, p_run_id;
      RETURN;
    END IF;
    active_id := runtime_cleanup_active_run(run.uid, run.runtime_scope_id, p_run_id);
    IF active_id IS NOT NULL THEN
      RETURN QUERY SELECT 'scope_active'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, active_id;
      RETURN;
    END IF;

    SELECT c.uid, c.workdir_path INTO conv FROM conversations c
      WHERE c.id = run.conversation_id OR (run.conversation_id IS NULL AND c.thread_id = run.conversation_thread_id)
      LIMIT 1;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'conversation_missing'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;
    IF conv.uid IS DISTINCT FROM run.uid THEN
      RETURN QUERY SELECT 'conversation_uid_mismatch'::text, run.uid, run.runtime_scope_id, NULL::text, NULL::text,
                          NULL::bigint, NULL::text, NULL::text;
      RETURN;
    END IF;

    SELECT s.sandbox_id, s.generation INTO sandbox FROM sandbox_runtimes s
      WHERE s.uid = run.uid AND s.runtime_scope_id = run.runtime_scope_id
        AND NOT runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                                    s.sandbox_id, s.generation);
    IF FOUND THEN
      RETURN QUERY SELECT 'release_needed'::text, run.uid, run.runtime_scope_id, conv.workdir_path,
                          sandbox.sandbox_id, sandbox.generation, run.fence_set_at, NULL::text;
    ELSE
      RETURN QUERY SELECT 'nothing_to_delete'::text, run.uid, run.runtime_scope_id, conv.workdir_path,
                          NULL::text, NULL::bigint, run.fence_set_at, NULL::text;
    END IF;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_finalize(p_run_id text, p_uid text, p_runtime_scope_id text, p_workdir_path text, p_sandbox_id text, p_generation bigint, p_fence_set_at text)
 RETURNS TABLE(decision text, blocking_run_id text, changed text[], cleaned_at text)
 LANGUAGE plpgsql
AS $function$
  DECLARE
    run record;
    conv record;
    sandbox record;
    live boolean;
    in_flight boolean;
    active_id text;
    moved text[] := ARRAY[]::text[];
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(p_uid, p_runtime_scope_id));
    SELECT r.uid, r.runtime_scope_id, r.status, r.runtime_cleanup_pending,
           r.runtime_cleanup_pending_since AS fence_set_at, r.conversation_id, r.conversation_thread_id
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id
      FOR UPDATE;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::text[], NULL::text;
      RETURN;
    END IF;

    -- The scope's sandbox row, locked: the write below may mark it, and its in-flight record is
    -- read as committed by the release that last held the scope's lock.
    SELECT s.sandbox_id, s.generation, s.delete_in_flight_run_id,
           runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                               s.sandbox_id, s.generation) AS released,
           coalesce(s.delete_in_flight_until > clock_timestamp(), false) AS in_flight
      INTO sandbox
      FROM sandbox_runtimes s
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
      FOR UPDATE;
    live := FOUND AND NOT sandbox.released;
    in_flight := FOUND AND sandbox.in_flight;

    IF run.runtime_cleanup_pending IS NOT TRUE THEN
      IF in_flight THEN
        RETURN QUERY SELECT 'delete_in_flight'::text, sandbox.delete_in_flight_run_id, NULL::text[], NULL::text;
      ELSE
        RETURN QUERY SELECT 'already_clear'::text, NULL::text, NULL::text[], NULL::text;
      END IF;
      RETURN;
    END IF;

    IF run.uid IS DISTINCT FROM p_uid OR run.runtime_scope_id IS DISTINCT FROM p_runtime_scope_id THEN
      moved := moved || 'scope'::text;
    END IF;
    -- Compared as instants: the text was rendered by phase 1 (ISO 8601 with offset, or by an
    -- older version in its session's format); either parses back to the same instant.
    IF run.fence_set_at IS DISTINCT FROM p_fence_set_at::timestamptz THEN
      moved := moved || 'fence'::text;
    END IF;
    IF cardinality(moved) > 0 THEN
      RETURN QUERY SELECT 'identity_changed'::text, NULL::text, moved, NULL::text;
      RETURN;
    END IF;

    IF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      RETURN QUERY SELECT 'run_not_terminal'::text, p_run_id, NULL::text[], NULL::text;
      RETURN;
    END IF;
    active_id := runtime_cleanup_active_run(p_uid, p_runtime_scope_id, p_run_id);
    IF active_id IS NOT NULL THEN
      RETURN QUERY SELECT 'scope_active'::text, active_id, NULL::text[], NULL::text;
      RETURN;
    END IF;

    SELECT c.uid, c.workdir_path INTO conv FROM conversations c
      WHERE c.id = run.conversation_id OR (run.conversation_id IS NULL AND c.thread_id = run.conversation_thread_id)
      LIMIT 1;
    IF conv.workdir_path IS DISTINCT FROM p_workdir_path OR conv.uid IS DISTINCT FROM p_uid THEN
      moved := moved || 'workdir'::text;
    END IF;
    -- The live sandbox is named by its id *and* its generation: the provisioner counts generations
    -- per sandbox id, so a sandbox re-created under another id can carry the very same number.
    IF live AND sandbox.sandbox_id IS DISTINCT FROM p_sandbox_id THEN
      moved := moved || 'sandbox'::text;
    ELSIF live AND sandbox.generation IS DISTINCT FROM p_generation THEN
      moved := moved || 'generation'::text;
    END IF;
    IF cardinality(moved) > 0 THEN
      RETURN QUERY SELECT 'identity_changed'::text, NULL::text, moved, NULL::text;
      RETURN;
    END IF;

    IF in_flight THEN
      RETURN QUERY SELECT 'delete_in_flight'::text, sandbox.delete_in_flight_run_id, NULL::text[], NULL::text;
      RETURN;
    END IF;

    UPDATE agent_runs SET runtime_cleanup_pending = false, updated_at = now()
      WHERE id = p_run_id AND runtime_cleanup_pending;
    UPDATE sandbox_runtimes s
      SET released_at = now(), released_sandbox_id = s.sandbox_id, released_generation = s.generation
      WHERE s.uid = p_uid AND s.runtime_scope_id = p_runtime_scope_id
        AND s.sandbox_id = p_sandbox_id AND s.generation = p_generation
        AND NOT runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                                    s.sandbox_id, s.generation);
    RETURN QUERY SELECT 'cleared'::text, NULL::text, NULL::text[], to_json(now()) #>> '{}';
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_force_clear(p_run_id text, p_reason text, p_actor text, p_apply boolean)
 RETURNS TABLE(verdict text, uid text, runtime_scope_id text, status text, fence_set_at text, sandbox_id text, generation bigint, active_run_id text, delete_in_flight_until text, delete_in_flight_run_id text, delete_in_flight_sandbox_id text, delete_in_flight_generation bigint, override_id bigint, forced_at text)
 LANGUAGE plpgsql
AS $function$
  DECLARE
    run record;
    sandbox record;
    active_id text;
    live_sandbox_id text;
    live_generation bigint;
    audit record;
  BEGIN
    PERFORM runtime_cleanup_require_read_committed();
    IF NOT runtime_cleanup_lock_run(p_run_id) THEN
      RETURN QUERY SELECT 'run_not_found'::text, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::bigint, NULL::text;
      RETURN;
    END IF;
    SELECT r.uid, r.runtime_scope_id, r.run_type, r.status, r.runtime_cleanup_pending,
           r.runtime_cleanup_pending_since, to_json(r.runtime_cleanup_pending_since) #>> '{}' AS fence_set_at
      INTO run
      FROM agent_runs r WHERE r.id = p_run_id;

    IF run.run_type = 'subagent' THEN
      verdict := 'run_not_root';
    ELSIF run.runtime_cleanup_pending IS NOT TRUE THEN
      verdict := 'fence_not_pending';
    ELSIF NOT runtime_cleanup_status_is_terminal(run.status) THEN
      verdict := 'run_not_terminal';
    ELSE
      active_id := runtime_cleanup_active_run(run.uid, run.runtime_scope_id, p_run_id);
      IF active_id IS NOT NULL THEN
        verdict := 'scope_active';
      END IF;
    END IF;
    IF verdict IS NOT NULL THEN
      RETURN QUERY SELECT verdict, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                          NULL::text, NULL::bigint, active_id, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::bigint, NULL::text;
      RETURN;
    END IF;

    SELECT s.sandbox_id, s.generation,
           runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                               s.sandbox_id, s.generation) AS released,
           coalesce(s.delete_in_flight_until > clock_timestamp(), false) AS in_flight,
           to_json(s.delete_in_flight_until) #>> '{}' AS in_flight_until,
           s.delete_in_flight_run_id, s.delete_in_flight_sandbox_id, s.delete_in_flight_generation
      INTO sandbox
      FROM sandbox_runtimes s
      WHERE s.uid = run.uid AND s.runtime_scope_id = run.runtime_scope_id
      FOR UPDATE;
    IF FOUND AND sandbox.in_flight THEN
      RETURN QUERY SELECT 'delete_in_flight'::text, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                          NULL::text, NULL::bigint, NULL::text, sandbox.in_flight_until,
                          sandbox.delete_in_flight_run_id, sandbox.delete_in_flight_sandbox_id,
                          sandbox.delete_in_flight_generation, NULL::bigint, NULL::text;
      RETURN;
    END IF;
    IF FOUND AND NOT sandbox.released THEN
      live_sandbox_id := sandbox.sandbox_id;
      live_generation := sandbox.generation;
    END IF;

    IF NOT p_apply THEN
      RETURN QUERY SELECT 'would_clear'::text, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                          live_sandbox_id, live_generation, NULL::text, NULL::text, NULL::text, NULL::text,
                          NULL::bigint, NULL::bigint, NULL::text;
      RETURN;
    END IF;

    -- The row lock held since runtime_cleanup_lock_run keeps the fence up until here.
    UPDATE agent_runs r SET runtime_cleanup_pending = false, updated_at = now()
      WHERE r.id = p_run_id AND r.runtime_cleanup_pending;
    INSERT INTO runtime_cleanup_overrides AS o
        (run_id, uid, runtime_scope_id, sandbox_id, generation, fence_set_at, reason, actor)
      VALUES (p_run_id, run.uid, run.runtime_scope_id, live_sandbox_id, live_generation,
              run.runtime_cleanup_pending_since, p_reason, p_actor)
      RETURNING o.id, to_json(o.forced_at) #>> '{}' AS forced_at INTO audit;
    RETURN QUERY SELECT 'cleared'::text, run.uid, run.runtime_scope_id, run.status, run.fence_set_at,
                        live_sandbox_id, live_generation, NULL::text, NULL::text, NULL::text, NULL::text,
                        NULL::bigint, audit.id, audit.forced_at;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_generation_released(released_at timestamp with time zone, released_sandbox_id text, released_generation bigint, sandbox_id text, generation bigint)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT released_at IS NOT NULL
       AND released_sandbox_id IS NOT DISTINCT FROM sandbox_id
       AND released_generation IS NOT DISTINCT FROM generation
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_lock_key(uid text, runtime_scope_id text)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$ SELECT hashtextextended(length(uid)::text || ':' || uid || ':' || runtime_scope_id, 0) $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_lock_run(p_run_id text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
  DECLARE
    locked_uid text;
    locked_scope text;
    run record;
  BEGIN
    SELECT r.uid, r.runtime_scope_id INTO locked_uid, locked_scope FROM agent_runs r WHERE r.id = p_run_id;
    LOOP
      IF locked_uid IS NULL THEN
        RETURN false;
      END IF;
      PERFORM pg_advisory_xact_lock(runtime_cleanup_lock_key(locked_uid, locked_scope));
      SELECT r.uid, r.runtime_scope_id INTO run FROM agent_runs r WHERE r.id = p_run_id FOR UPDATE;
      IF NOT FOUND THEN
        locked_uid := NULL;
      ELSIF run.uid = locked_uid AND run.runtime_scope_id = locked_scope THEN
        RETURN true;
      ELSE
        locked_uid := run.uid;
        locked_scope := run.runtime_scope_id;
      END IF;
    END LOOP;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_require_read_committed()
 RETURNS void
 LANGUAGE plpgsql
AS $function$
  BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION 'runtime cleanup decisions need READ COMMITTED; this transaction is %',
          upper(current_setting('transaction_isolation'))
        USING ERRCODE = 'invalid_transaction_state',
              HINT = 'Begin the transaction with BEGIN ISOLATION LEVEL READ COMMITTED: under a higher level a decision would read a snapshot taken before its locks were granted.';
    END IF;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_setting_of_record(p_name text, p_value double precision)
 RETURNS double precision
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT greatest(p_value, (SELECT s.value FROM runtime_cleanup_settings s WHERE s.name = p_name))
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_settings_of_record(p_settings jsonb, p_by text)
 RETURNS TABLE(name text, value double precision, recorded_at timestamp with time zone, recorded_by text)
 LANGUAGE plpgsql
AS $function$
  BEGIN
    -- NaN and Infinity pass the table's `value >= 0` check, and NaN compares as the largest
    -- number: a NaN share would switch the share brake off for every reader, an infinite grace
    -- would fail every run. A deployed writer never sends them; refuse them loudly.
    IF EXISTS (SELECT 1 FROM jsonb_each(p_settings) AS e
               WHERE NOT ((e.value #>> '{}')::double precision BETWEEN 0 AND 1e12)) THEN
      RAISE EXCEPTION 'runtime_cleanup_settings_of_record: every setting must be a finite number between 0 and 1e12: %', p_settings
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_by IS NOT NULL THEN
      INSERT INTO runtime_cleanup_settings AS s (name, value, recorded_at, recorded_by)
      SELECT e.key, (e.value #>> '{}')::double precision, now(), p_by
      FROM jsonb_each(p_settings) AS e
      ON CONFLICT ON CONSTRAINT runtime_cleanup_settings_pkey DO UPDATE
        SET value = EXCLUDED.value, recorded_at = EXCLUDED.recorded_at, recorded_by = EXCLUDED.recorded_by
        WHERE CASE WHEN s.name IN ('reclaim_max_share_percent', 'reclaim_max_per_run')
                   THEN EXCLUDED.value <= s.value
                   ELSE EXCLUDED.value >= s.value END
           OR s.recorded_at <= now() - make_interval(secs => 900);
    END IF;
    RETURN QUERY SELECT s.name, s.value, s.recorded_at, s.recorded_by FROM runtime_cleanup_settings s ORDER BY s.name;
  END
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_status_is_active(status text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT status IS NULL OR status NOT IN ('completed', 'failed', 'cancelled', 'interrupted') $function$;

CREATE OR REPLACE FUNCTION public.runtime_cleanup_status_is_terminal(status text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT NOT runtime_cleanup_status_is_active(status) $function$;

CREATE OR REPLACE FUNCTION public.runtime_reclaim_lock_key(sandbox_id text)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$ SELECT hashtextextended('reclaim:' || sandbox_id, 0) $function$;

CREATE OR REPLACE FUNCTION public.runtime_reclaim_scope_hold(p_uid text, p_runtime_scope_id text, p_grace_seconds double precision)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT CASE
      WHEN EXISTS (SELECT 1 FROM agent_runs a
                   WHERE a.uid = p_uid AND a.runtime_scope_id = p_runtime_scope_id
                     AND runtime_cleanup_status_is_active(a.status))
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
  $function$;

CREATE OR REPLACE FUNCTION public.runtime_reclaim_scope_last_activity(p_uid text, p_runtime_scope_id text)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT coalesce(greatest(
      (SELECT max(greatest(r.created_at, r.updated_at, r.finished_at)) FROM agent_runs r
        WHERE r.uid = p_uid AND r.runtime_scope_id = p_runtime_scope_id),
      (SELECT max(o.forced_at) FROM runtime_cleanup_overrides o
        WHERE o.uid = p_uid AND o.runtime_scope_id = p_runtime_scope_id)
    ), '-infinity'::timestamptz)
  $function$;

CREATE OR REPLACE FUNCTION public.sandbox_runtimes_refuse_reclaimed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
      IF EXISTS (SELECT 1 FROM runtime_reclaim_sightings g WHERE g.sandbox_id = NEW.sandbox_id)
         OR EXISTS (SELECT 1 FROM runtime_reclaim_tombstones t WHERE t.sandbox_id = NEW.sandbox_id) THEN
        PERFORM runtime_cleanup_require_read_committed();
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
  $function$;

CREATE OR REPLACE FUNCTION public.sandbox_runtimes_reset_released()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
  BEGIN
    IF TG_OP = 'INSERT'
       OR NEW.sandbox_id IS DISTINCT FROM OLD.sandbox_id
       OR NEW.generation IS DISTINCT FROM OLD.generation THEN
      NEW.released_at := NULL;
    END IF;
    RETURN NEW;
  END
  $function$;

CREATE TRIGGER agent_runs_track_fence BEFORE INSERT OR UPDATE OF runtime_cleanup_pending ON public.agent_runs FOR EACH ROW EXECUTE FUNCTION agent_runs_track_fence();
CREATE TRIGGER sandbox_runtimes_refuse_reclaimed BEFORE INSERT OR UPDATE ON public.sandbox_runtimes FOR EACH ROW EXECUTE FUNCTION sandbox_runtimes_refuse_reclaimed();
CREATE TRIGGER sandbox_runtimes_reset_released BEFORE INSERT OR UPDATE ON public.sandbox_runtimes FOR EACH ROW EXECUTE FUNCTION sandbox_runtimes_reset_released();
