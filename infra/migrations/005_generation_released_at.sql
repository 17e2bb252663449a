-- `sandbox_runtimes.released_at` belongs to one (sandbox_id, generation) (issue 11, item 3): a
-- trigger resets it whenever the platform records a new sandbox or generation, whatever the
-- platform's upsert names. Why, and what it deliberately leaves alone: the trigger function's file,
-- infra/sql/sandbox_runtimes_reset_released.sql.
DROP TRIGGER IF EXISTS sandbox_runtimes_reset_released ON sandbox_runtimes;
CREATE TRIGGER sandbox_runtimes_reset_released
  BEFORE INSERT OR UPDATE ON sandbox_runtimes
  FOR EACH ROW EXECUTE FUNCTION sandbox_runtimes_reset_released();
