/*
 * Glossary of the local provisioner.
 *
 * - sandbox: a real child process (a shell waiting on its stdin) with its own work directory
 *   under the root directory. It stands in for the platform's remote sandbox.
 * - sandbox id: the caller's name for a sandbox; any string. Never used as a path: the work
 *   directory gets a safe name derived from it (see `sandboxDirectoryName`).
 * - generation: a counter per sandbox id, 1 for the first sandbox ever created under that id
 *   and one more for each re-creation. Never reused, so a stale DELETE can be told apart
 *   from a current one (contract §3: `409 {"current_generation": N}`).
 * - live: created and not yet deleted. A live sandbox whose process crashed is still live
 *   (its `alive` flag is false) until someone deletes it, like a remote sandbox would be.
 * - fault: a rule that makes matching API requests misbehave (latency, hang, error, reset…)
 *   so tests, benchmarks and the chaos suite can exercise the caller's failure handling.
 * - audit entry: one record per API request, written on arrival and completed when the
 *   request is answered, aborted by the client, reset by a fault or still hung at stop.
 */

/**
 * Which provisioner the local one behaves like.
 *
 * - `contract`: the contract's provisioner (section 3), with the generation guard: a DELETE names
 *   a generation and touches only that one (`409 {"current_generation"}` otherwise).
 * - `platform`: the platform's provisioner as it is deployed today. Its DELETE ignores any
 *   `generation` and removes whatever sandbox has that id, answering `200 {"ok": true,
 *   "sandbox_id"}` even when there was none; its list carries no generation. POST reuses a live
 *   sandbox in both modes. POST and GET of one sandbox still report the generation the local
 *   provisioner counts, so the local platform simulator can record it.
 */
export const PROVISIONER_MODE = { contract: 'contract', platform: 'platform' } as const;
export type ProvisionerMode = (typeof PROVISIONER_MODE)[keyof typeof PROVISIONER_MODE];

/** The HTTP methods the provisioner API serves; faults filter on them. */
export const API_METHOD = { GET: 'GET', POST: 'POST', DELETE: 'DELETE' } as const;
export type ApiMethod = (typeof API_METHOD)[keyof typeof API_METHOD];

/** A live sandbox as the introspection API reports it. */
export interface SandboxInfo {
  readonly id: string;
  readonly generation: number;
  readonly pid: number;
  /** Absolute path of the sandbox's work directory (always inside the root directory). */
  readonly dir: string;
  /** Whether the sandbox's process is still running (false once it has exited or crashed). */
  readonly alive: boolean;
  /** Milliseconds since the epoch. */
  readonly createdAt: number;
}

/**
 * How an audited request ended. `pending` while it is being handled; `hung` only for a
 * request still held by a `hang` fault when the provisioner stopped.
 */
export const AUDIT_OUTCOME = {
  pending: 'pending',
  answered: 'answered',
  aborted: 'aborted',
  reset: 'reset',
  hung: 'hung',
} as const;
export type AuditOutcome = (typeof AUDIT_OUTCOME)[keyof typeof AUDIT_OUTCOME];

/** One API request as the provisioner saw it. */
export interface AuditEntry {
  /** 1, 2, 3… in arrival order, never reused within one provisioner. */
  readonly seq: number;
  /** Arrival, milliseconds since the epoch. */
  readonly at: number;
  readonly method: string;
  /** The request path without the query string, as sent (still percent-encoded). */
  readonly path: string;
  /** The decoded sandbox id from the path or the POST body, when there is one. */
  sandboxId?: string;
  /** The `generation` query parameter of a DELETE, when it was a valid integer. */
  generation?: number;
  /** The status code sent, once headers were written. */
  status?: number;
  outcome: AuditOutcome;
  /** Which fault, if any, was applied: `latency`, `hang`, `status:503`, `reset`, … */
  fault?: string;
  /** The Retry-After header sent with a faulted status, as sent. */
  retryAfter?: string;
  /**
   * How long that Retry-After asked the client to wait, in milliseconds from the answer: what a
   * retry is judged by (absent for a raw header value, which may mean anything or nothing).
   */
  retryAfterAskedMs?: number;
  /** Milliseconds since the epoch with sub-millisecond precision (for durations). */
  readonly startedAt: number;
  endedAt?: number;
  /** The generation this request really deleted (set even when the client did not hear it). */
  deletedGeneration?: number;
  /**
   * When it was deleted (same clock as `startedAt`): after `endedAt` when the client gave up
   * first and the request was carried out anyway (`latency` with `completeIfAbandoned`).
   */
  deletedAt?: number;
}

/** What an `onRequest` listener learns about an API request before it is handled. */
export interface RequestInfo {
  readonly method: string;
  readonly sandboxId?: string;
  readonly generation?: number;
}

export type RequestListener = (info: RequestInfo) => Promise<void> | void;
