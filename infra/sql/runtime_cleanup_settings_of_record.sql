-- Records the deployment's settings (p_by set: the deployed reclaimer, at every run) and returns
-- what is recorded. One statement; an operator's tool calls it with p_by NULL and only reads.
--
-- A record never loosens a setting at once: a shorter grace, hold, residual or bound, or a larger
-- share or per-run bound, replaces the recorded value only once that value was last recorded
-- 900 s ago (Lambda's longest run). Until then the stricter one stays, with its time and author.
-- Every writer is "the deployment": a stage redeployed with a shorter grace while a worker of the
-- previous version is still running would otherwise see the two overwrite each other each run, and
-- a guard called in between (`ops reclaim --yes`, which applies the larger of its shell's values and
-- these) would act on the shorter one before the older worker had finished with its longer one.
-- The older worker re-records its value at each run it starts, so the stricter value lasts as long
-- as any worker still holds it, plus one run; the redeployed stage's looser value is in force from
-- its first run after that. A stricter record (a raised grace) replaces the value at once. Which
-- way is stricter is the same as in `recordableSettings` (functions/cleanup/reclaim.ts): smaller
-- for the two brakes named below, larger for every other setting.
CREATE OR REPLACE FUNCTION runtime_cleanup_settings_of_record(p_settings jsonb, p_by text)
  RETURNS TABLE (name text, value double precision, recorded_at timestamptz, recorded_by text)
  LANGUAGE plpgsql VOLATILE
  AS $$
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
  $$;
