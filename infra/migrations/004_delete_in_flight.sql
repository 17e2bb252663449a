-- The release guard, bound to the sandbox it deletes, and the quarantine of a scope while a
-- delete may still be in flight (issue 11, items 1 and 2): the guard records "a delete is in
-- flight until T" on the scope's sandbox row under the scope's advisory lock, and admission and
-- force-clear honour the record. Why a plain read before the DELETE was not enough:
-- infra/sql/runtime_cleanup_begin_release.sql. The functions this migration defined
-- (runtime_cleanup_blocked honouring the record, runtime_cleanup_begin_release writing it) live
-- in infra/sql/.
--
-- All new columns are nullable: a row written with only the contract's columns stays valid.
--
-- delete_in_flight_until: no run may be admitted to the scope before this time (NULL: no delete
--   in flight). Set by runtime_cleanup_begin_release to the longest a delete it lets through can
--   still act at the provisioner; lowered by the release itself once the provisioner answered.
-- delete_in_flight_token: the release attempt that set it; a release clears only its own record.
-- delete_in_flight_run_id / _sandbox_id / _generation: what the delete is for (operators read them).
ALTER TABLE sandbox_runtimes
  ADD COLUMN IF NOT EXISTS delete_in_flight_until timestamptz,
  ADD COLUMN IF NOT EXISTS delete_in_flight_token text,
  ADD COLUMN IF NOT EXISTS delete_in_flight_run_id text,
  ADD COLUMN IF NOT EXISTS delete_in_flight_sandbox_id text,
  ADD COLUMN IF NOT EXISTS delete_in_flight_generation bigint;

