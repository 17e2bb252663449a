-- Trigger function of sandbox_runtimes_reset_released (created in migration 005):
-- `sandbox_runtimes.released_at` belongs to one (sandbox_id, generation).
--
-- The platform records each new sandbox or generation with an upsert of its own. One that leaves
-- `released_at` alone (`ON CONFLICT … DO UPDATE SET sandbox_id = …, generation = …`) kept the old
-- generation's release on the new one: the next cleanup then saw "nothing to delete", cleared the
-- fence and left the new sandbox running. The database guarantees the rule whatever the
-- platform's statement names: on INSERT, and whenever the sandbox id or the generation changes,
-- `released_at` reads NULL afterwards. An UPDATE that keeps both (finalize marking the generation
-- released) is left alone. A write that bypasses the trigger is covered by the release mark naming
-- its generation (runtime_cleanup_generation_released).
--
-- The delete-in-flight record is deliberately NOT reset here: the DELETE it stands for may be the
-- platform provisioner's, which ignores the generation and removes whatever container has that id,
-- so a new generation recorded under the same id is exactly what it can still hit. The record
-- expires by itself.
CREATE OR REPLACE FUNCTION sandbox_runtimes_reset_released() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
  BEGIN
    IF TG_OP = 'INSERT'
       OR NEW.sandbox_id IS DISTINCT FROM OLD.sandbox_id
       OR NEW.generation IS DISTINCT FROM OLD.generation THEN
      NEW.released_at := NULL;
    END IF;
    RETURN NEW;
  END
  $$;
