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
