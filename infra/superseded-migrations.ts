/**
 * Migration texts an earlier release applied, accepted by the runner (infra/migrate.ts) in place of
 * today's file of the same version.
 *
 * The runner refuses an applied migration whose file changed: migrations are append-only. One
 * rewrite was made on purpose (issue 23, "one home for each rule"): migrations 001–010 used to
 * define SQL functions, 16 functions in 21 definitions, so the current body of a function could only
 * be found by reading every migration. The functions moved to one file each under infra/sql/, and
 * the migrations were rewritten to keep only tables, columns, indexes, triggers and data changes.
 * A database that applied the old texts reaches the same schema as a fresh one: the runner applies
 * infra/sql/ to it like to any database, and migration 011 removes what the old texts made that the
 * current schema no longer has. test/integration/migrate-history.test.ts proves it, building a
 * database with the old texts (from git history) and comparing its schema with a fresh one.
 *
 * Each entry: the sha256 of the file as it was at commit 38a81ac (the last commit before the
 * rewrite), `git show 38a81ac:infra/migrations/<file> | sha256sum`. Never add an entry for a
 * migration that changed what it does: write a new migration instead.
 */
export const SUPERSEDED_MIGRATION_CHECKSUMS: Readonly<Record<number, readonly string[]>> = {
  // 001_schema.sql: defined runtime_cleanup_lock_key and runtime_cleanup_blocked; its partial index
  // spelled out the terminal statuses (011 rebuilds it with runtime_cleanup_status_is_active).
  1: ['b111eb3a051249cfc4e5800196b984ce1b78550253c59efab9ef86e2cb1dcdb0'],
  // 002_fence_bookkeeping.sql: defined the trigger function agent_runs_track_fence.
  2: ['e424bbd8456d8a80730711f968b7948e3fd270ae75b2f9b0f8e0d5fea37f1295'],
  // 004_delete_in_flight.sql: defined runtime_cleanup_blocked again and runtime_cleanup_begin_release.
  4: ['fa9ca223799b9f63e8a84686d0c4c54b00637d38d7cce4f2e9e670619f180537'],
  // 005_generation_released_at.sql: defined the trigger function sandbox_runtimes_reset_released.
  5: ['7105884bed5cebe0ca7fa4f5d652512f020cb8b1d92ab56ded6e7cbd0eb8d82e'],
  // 008_phase_functions.sql: defined the phase functions and their helpers.
  8: ['1f0dc7653503dc795e730e79c27df8208c3fcf46c04307226e80b5a90a647b6e'],
  // 009_reclaim.sql: defined the reclaim functions and the trigger function sandbox_runtimes_refuse_reclaimed.
  9: ['d88c56420fa0fd9e963d0cc5780506cc094b1c081bb13270c7dd8db32c840f99'],
  // 010_lock_taken_at.sql: restated three decision functions with the benchmark's lock-taken note
  // (now installed by the benchmark into its own databases only; 011 drops the note function).
  10: ['89f3a1ba8a098db44938298b0470dcf00ba451c9c92d2f6e6256c1c1e2ea0fe8'],
};

/** The commit whose migration texts the checksums above are of (read by the history test). */
export const SUPERSEDED_AT_COMMIT = '38a81ac';
