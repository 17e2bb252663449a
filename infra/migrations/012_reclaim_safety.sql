-- The reclaimer held to the release path's safety (issue 21): the tables and columns. The functions
-- that use them are in infra/sql/ (runtime_cleanup_begin_reclaim, runtime_cleanup_end_reclaim,
-- runtime_cleanup_end_delete_in_flight, runtime_cleanup_settings_of_record, …).
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
UPDATE runtime_reclaim_tombstones SET token = 'before-012:' || sandbox_id WHERE token IS NULL;
ALTER TABLE runtime_reclaim_tombstones ALTER COLUMN token SET NOT NULL;
ALTER TABLE runtime_reclaim_tombstones DROP CONSTRAINT IF EXISTS runtime_reclaim_tombstones_pkey;
ALTER TABLE runtime_reclaim_tombstones ADD PRIMARY KEY (sandbox_id, token);

-- The end of a delete finds its records by the attempt's token (release and reclaim alike).
CREATE INDEX IF NOT EXISTS sandbox_runtimes_by_delete_in_flight_token ON sandbox_runtimes (delete_in_flight_token)
  WHERE delete_in_flight_token IS NOT NULL;
