-- 010 restated three decision functions (fence check, finalize, release guard) whole, to add one
-- call after each scope lock that noted the moment the lock was taken
-- (`runtime_cleanup.lock_taken_at`), for the benchmark's server-side lock-hold figure. It changed no
-- table, column or index, so nothing of it is left here: the decision functions live in infra/sql/
-- without the note (a product database reads the setting as unset), and `npm run bench` installs
-- its own instrumented copies, generated from those files, into its own databases
-- (bench/support/instrumented-functions.ts). Migration 011 drops the note function from databases
-- that applied the old text.
SELECT 1;
