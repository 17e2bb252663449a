/**
 * The chaos suite's own instrumentation in its own database: AFTER triggers that append every
 * run status and fence transition, and every change of a scope's recorded sandbox, to two
 * append-only tables. The rows carry the database clock (`clock_timestamp()`, taken inside the
 * writing statement, so before its commit) and the writing transaction's id, which tells a clear
 * and the sandbox release it made in the same statement apart from everything else.
 *
 * Nothing of the product reads these tables; they exist only in databases the chaos suite creates.
 */
import type { Executor } from '../../functions/adapters/database.ts';

export const INSTALL_LEDGER = `
  CREATE TABLE IF NOT EXISTS chaos_run_log (
    seq               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                timestamptz NOT NULL DEFAULT clock_timestamp(),
    txid              bigint NOT NULL DEFAULT txid_current(),
    run_id            text NOT NULL,
    uid               text NOT NULL,
    runtime_scope_id  text NOT NULL,
    run_type          text NOT NULL,
    created_by_run_id text,
    status            text NOT NULL,
    pending           boolean NOT NULL,
    pending_since     timestamptz
  );
  CREATE TABLE IF NOT EXISTS chaos_sandbox_log (
    seq               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                timestamptz NOT NULL DEFAULT clock_timestamp(),
    txid              bigint NOT NULL DEFAULT txid_current(),
    uid               text NOT NULL,
    runtime_scope_id  text NOT NULL,
    sandbox_id        text NOT NULL,
    generation        bigint NOT NULL,
    released          boolean NOT NULL
  );
  CREATE OR REPLACE FUNCTION chaos_log_run() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO chaos_run_log (run_id, uid, runtime_scope_id, run_type, created_by_run_id, status, pending, pending_since)
    VALUES (NEW.id, NEW.uid, NEW.runtime_scope_id, NEW.run_type, NEW.created_by_run_id, NEW.status,
            NEW.runtime_cleanup_pending, NEW.runtime_cleanup_pending_since);
    RETURN NULL;
  END $$;
  CREATE OR REPLACE FUNCTION chaos_log_sandbox() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO chaos_sandbox_log (uid, runtime_scope_id, sandbox_id, generation, released)
    VALUES (NEW.uid, NEW.runtime_scope_id, NEW.sandbox_id, NEW.generation, NEW.released_at IS NOT NULL);
    RETURN NULL;
  END $$;
  DROP TRIGGER IF EXISTS chaos_log_run_insert ON agent_runs;
  CREATE TRIGGER chaos_log_run_insert AFTER INSERT ON agent_runs
    FOR EACH ROW EXECUTE FUNCTION chaos_log_run();
  DROP TRIGGER IF EXISTS chaos_log_run_update ON agent_runs;
  CREATE TRIGGER chaos_log_run_update AFTER UPDATE ON agent_runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       OR OLD.runtime_cleanup_pending IS DISTINCT FROM NEW.runtime_cleanup_pending)
    EXECUTE FUNCTION chaos_log_run();
  DROP TRIGGER IF EXISTS chaos_log_sandbox ON sandbox_runtimes;
  CREATE TRIGGER chaos_log_sandbox AFTER INSERT OR UPDATE ON sandbox_runtimes
    FOR EACH ROW EXECUTE FUNCTION chaos_log_sandbox();
  -- The ledger records writes that bypass ordinary triggers too (a replication apply, a restore).
  ALTER TABLE sandbox_runtimes ENABLE ALWAYS TRIGGER chaos_log_sandbox;
  ALTER TABLE agent_runs ENABLE ALWAYS TRIGGER chaos_log_run_insert;
  ALTER TABLE agent_runs ENABLE ALWAYS TRIGGER chaos_log_run_update;`;

const READ_RUN_LOG = `
  SELECT seq::text, (extract(epoch FROM at) * 1000)::float8 AS at_ms, txid::text, run_id, uid, runtime_scope_id,
         run_type, created_by_run_id, status, pending,
         (extract(epoch FROM pending_since) * 1000)::float8 AS pending_since_ms,
         to_json(pending_since) #>> '{}' AS pending_since_text
  FROM chaos_run_log WHERE seq > $1::bigint ORDER BY seq`;

const READ_SANDBOX_LOG = `
  SELECT seq::text, (extract(epoch FROM at) * 1000)::float8 AS at_ms, txid::text, uid, runtime_scope_id,
         sandbox_id, generation::text, released
  FROM chaos_sandbox_log WHERE seq > $1::bigint ORDER BY seq`;

/** One row of chaos_run_log, its times on the database clock (epoch ms). */
export interface RunLogEntry {
  seq: number;
  atMs: number;
  txid: string;
  runId: string;
  uid: string;
  runtimeScopeId: string;
  runType: string;
  createdByRunId: string | null;
  status: string;
  pending: boolean;
  pendingSinceMs: number | null;
  /** ISO 8601 with offset, as phase 1 captures it (`fenceSetAt` in the messages). */
  pendingSinceText: string | null;
}

export interface SandboxLogEntry {
  seq: number;
  atMs: number;
  txid: string;
  uid: string;
  runtimeScopeId: string;
  sandboxId: string;
  generation: number;
  released: boolean;
}

interface RunRow {
  seq: string;
  at_ms: number;
  txid: string;
  run_id: string;
  uid: string;
  runtime_scope_id: string;
  run_type: string;
  created_by_run_id: string | null;
  status: string;
  pending: boolean;
  pending_since_ms: number | null;
  pending_since_text: string | null;
}

interface SandboxRow {
  seq: string;
  at_ms: number;
  txid: string;
  uid: string;
  runtime_scope_id: string;
  sandbox_id: string;
  generation: string;
  released: boolean;
}

export async function installLedger(db: Executor): Promise<void> {
  await db.query(INSTALL_LEDGER);
}

/**
 * Reads the ledger incrementally. Identity values are handed out before commit, so a row with a
 * lower seq can become visible after a higher one: every read looks back LOOKBACK rows behind the
 * highest seq seen and de-duplicates, which covers transactions that commit that much later
 * (cleanup transactions last milliseconds). The final read for the checks starts from zero.
 */
export class LedgerReader {
  static readonly LOOKBACK = 5_000;
  readonly runs = new Map<number, RunLogEntry>();
  readonly sandboxes = new Map<number, SandboxLogEntry>();
  #maxRunSeq = 0;
  #maxSandboxSeq = 0;

  constructor(private readonly db: Executor) {}

  async poll(full = false): Promise<void> {
    const runFrom = full ? 0 : Math.max(0, this.#maxRunSeq - LedgerReader.LOOKBACK);
    const sandboxFrom = full ? 0 : Math.max(0, this.#maxSandboxSeq - LedgerReader.LOOKBACK);
    const [runs, sandboxes] = await Promise.all([
      this.db.query<RunRow>(READ_RUN_LOG, [runFrom]),
      this.db.query<SandboxRow>(READ_SANDBOX_LOG, [sandboxFrom]),
    ]);
    for (const row of runs.rows) {
      const seq = Number(row.seq);
      this.#maxRunSeq = Math.max(this.#maxRunSeq, seq);
      this.runs.set(seq, {
        seq,
        atMs: row.at_ms,
        txid: row.txid,
        runId: row.run_id,
        uid: row.uid,
        runtimeScopeId: row.runtime_scope_id,
        runType: row.run_type,
        createdByRunId: row.created_by_run_id,
        status: row.status,
        pending: row.pending,
        pendingSinceMs: row.pending_since_ms,
        pendingSinceText: row.pending_since_text,
      });
    }
    for (const row of sandboxes.rows) {
      const seq = Number(row.seq);
      this.#maxSandboxSeq = Math.max(this.#maxSandboxSeq, seq);
      this.sandboxes.set(seq, {
        seq,
        atMs: row.at_ms,
        txid: row.txid,
        uid: row.uid,
        runtimeScopeId: row.runtime_scope_id,
        sandboxId: row.sandbox_id,
        generation: Number(row.generation),
        released: row.released,
      });
    }
  }
}
