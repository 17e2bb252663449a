/**
 * Glossary
 *
 * - **run** — one AgentRun row. A *root* run (`run_type <> 'subagent'`) owns the cleanup of its
 *   runtime scope's sandbox; a subagent run never does.
 * - **runtime scope** — `(uid, runtime_scope_id)`: the unit that shares one sandbox. Its advisory
 *   lock key is `runtime_cleanup_lock_key(uid, runtime_scope_id)`.
 * - **fence** — `agent_runs.runtime_cleanup_pending = true` on a terminal root run: "the old
 *   runtime is not yet confirmed gone". While any fence of a scope is up,
 *   `runtime_cleanup_blocked(uid, scope)` is true and the platform admits no new run there.
 * - **fence set at** — when the fence was last raised (maintained by a trigger). Captured in
 *   phase 1 and re-checked in phase 3, so a fence raised again later is never cleared by an old
 *   cleanup.
 * - **Workdir** — `conversations.workdir_path`, the identity of the files the sandbox served.
 * - **sandbox generation** — `sandbox_runtimes.generation`, bumped each time the scope's sandbox is
 *   (re)created. The provisioner deletes only the generation it is asked to, which is what makes
 *   repeated and late deletes harmless.
 * - **cleanup identity** — what phase 1 resolved and phase 3 re-checks: run, uid, scope, Workdir,
 *   sandbox id and generation, fence set at.
 * - **release** — phase 2: deleting the sandbox at the provisioner, with no database transaction
 *   open, bounded in time.
 */

export const RunType = { CHAT: 'chat', RESUME: 'resume', SUBAGENT: 'subagent' } as const;

/** What phase 1 resolved: everything phase 2 needs and phase 3 re-checks. */
export interface CleanupIdentity {
  runId: string;
  uid: string;
  runtimeScopeId: string;
  workdirPath: string;
  /** Null when the scope has no live sandbox generation: nothing to delete. */
  sandboxId: string | null;
  generation: number | null;
  /** `runtime_cleanup_pending_since` as PostgreSQL text, exact to the microsecond. */
  fenceSetAt: string | null;
}

export const FenceCheckOutcome = {
  RELEASE_NEEDED: 'release_needed',
  NOTHING_TO_DELETE: 'nothing_to_delete',
  ALREADY_CLEAN: 'already_clean',
  DEFERRED: 'deferred',
  NOT_OWNER: 'not_owner',
} as const;
export type FenceCheckOutcome = (typeof FenceCheckOutcome)[keyof typeof FenceCheckOutcome];

export const DeferralReason = {
  RUN_NOT_TERMINAL: 'run_not_terminal',
  ACTIVE_RUN_IN_SCOPE: 'active_run_in_scope',
  /** Finalize only: a delete may still act on the scope's sandbox (its in-flight record is live). */
  DELETE_IN_FLIGHT: 'delete_in_flight',
} as const;
export type DeferralReason = (typeof DeferralReason)[keyof typeof DeferralReason];

export type FenceCheckResult =
  | { outcome: typeof FenceCheckOutcome.RELEASE_NEEDED; identity: CleanupIdentity }
  | { outcome: typeof FenceCheckOutcome.NOTHING_TO_DELETE; identity: CleanupIdentity }
  | { outcome: typeof FenceCheckOutcome.ALREADY_CLEAN; runId: string }
  | { outcome: typeof FenceCheckOutcome.NOT_OWNER; runId: string }
  | {
      outcome: typeof FenceCheckOutcome.DEFERRED;
      runId: string;
      reason: DeferralReason;
      blockingRunId: string;
    };

export const ReleaseOutcome = {
  /** 200: the captured generation was deleted by this call. */
  DELETED: 'deleted',
  /** 404: no such sandbox; already gone. */
  ABSENT: 'absent',
  /** 409 with a newer current generation: the captured one is already gone. */
  SUPERSEDED: 'superseded',
} as const;
export type ReleaseOutcome = (typeof ReleaseOutcome)[keyof typeof ReleaseOutcome];

export interface ReleaseResult {
  outcome: ReleaseOutcome;
  lockWaitMs: number;
  deleteMs: number;
  /**
   * Requests of this release that went unanswered (reset after they may have been written) before
   * the one answered: the provisioner may still be carrying them out, so the delete-in-flight
   * record keeps a residual window instead of ending. 0 or absent: none.
   */
  unansweredAttempts?: number;
}

export const FinalizeOutcome = {
  CLEARED: 'cleared',
  ALREADY_CLEAR: 'already_clear',
  DEFERRED: 'deferred',
  IDENTITY_CHANGED: 'identity_changed',
} as const;
export type FinalizeOutcome = (typeof FinalizeOutcome)[keyof typeof FinalizeOutcome];

export type FinalizeResult =
  | { outcome: typeof FinalizeOutcome.CLEARED; cleanedAt: string }
  | { outcome: typeof FinalizeOutcome.ALREADY_CLEAR }
  | { outcome: typeof FinalizeOutcome.DEFERRED; reason: DeferralReason; blockingRunId: string }
  | { outcome: typeof FinalizeOutcome.IDENTITY_CHANGED; changed: string[] };
