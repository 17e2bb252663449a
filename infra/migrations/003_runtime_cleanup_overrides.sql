-- The audit trail of forced clears (`npm run ops -- force-clear`): one row per fence an operator
-- cleared without a confirmed delete, written in the same transaction as the clear, so a forced
-- clear can never be silent. `ops explain <runId>` and `ops fences --history` read it.
--
-- No foreign key to agent_runs: the record must outlive the run row (retention jobs may delete
-- runs; the audit of what was done to them stays). Rows are only ever inserted.
--
-- sandbox_id / generation: the scope's live sandbox generation at the moment of the clear, i.e.
--   what may still exist at the provisioner and must be removed by hand; null when the scope had
--   no live generation.
-- fence_set_at: runtime_cleanup_pending_since of the fence that was cleared, to tell apart two
--   forced clears of one run (the fence can be raised again later).
CREATE TABLE runtime_cleanup_overrides (
  id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run_id            text NOT NULL,
  uid               text NOT NULL,
  runtime_scope_id  text NOT NULL,
  sandbox_id        text,
  generation        bigint,
  fence_set_at      timestamptz,
  reason            text NOT NULL CHECK (length(btrim(reason)) BETWEEN 1 AND 500),
  actor             text NOT NULL CHECK (length(btrim(actor)) BETWEEN 1 AND 128),
  forced_at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX runtime_cleanup_overrides_by_run ON runtime_cleanup_overrides (run_id);
CREATE INDEX runtime_cleanup_overrides_by_time ON runtime_cleanup_overrides (forced_at DESC);
