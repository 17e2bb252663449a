-- The settings a caller's values may not go below: the larger of the two, per setting.
CREATE OR REPLACE FUNCTION runtime_cleanup_setting_of_record(p_name text, p_value double precision)
  RETURNS double precision
  LANGUAGE sql STABLE PARALLEL SAFE
  AS $$
    SELECT greatest(p_value, (SELECT s.value FROM runtime_cleanup_settings s WHERE s.name = p_name))
  $$;
