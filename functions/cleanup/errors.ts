/**
 * Every failure the cleanup can meet, as one base class and a subclass per failure.
 *
 * Callers branch on `code` and `retryable`, never on message text: `retryable` decides between
 * "fail the SQS item and let it come back with backoff" and "move it to the dead-letter queue now
 * with its reason". The message is for people and may change; the code is a stable contract with
 * logs, metrics and dead-letter reasons.
 */
export const ErrorCode = {
  MESSAGE_INVALID: 'MESSAGE_INVALID',
  RUN_NOT_FOUND: 'RUN_NOT_FOUND',
  OWNERSHIP_CONFLICT: 'OWNERSHIP_CONFLICT',
  RELEASE_LOCK_TIMEOUT: 'RELEASE_LOCK_TIMEOUT',
  PROVISIONER_DELETE_TIMEOUT: 'PROVISIONER_DELETE_TIMEOUT',
  CLEANUP_TIMEOUT: 'CLEANUP_TIMEOUT',
  PROVISIONER_UNAVAILABLE: 'PROVISIONER_UNAVAILABLE',
  PROVISIONER_THROTTLED: 'PROVISIONER_THROTTLED',
  PROVISIONER_CONNECTION: 'PROVISIONER_CONNECTION',
  PROVISIONER_REJECTED: 'PROVISIONER_REJECTED',
  PROVISIONER_BAD_RESPONSE: 'PROVISIONER_BAD_RESPONSE',
  PROVISIONER_UNCONFIRMED: 'PROVISIONER_UNCONFIRMED',
  // A 404/410 from a base URL whose GET /api/sandboxes is not the provisioner's listing.
  PROVISIONER_URL_UNVERIFIED: 'PROVISIONER_URL_UNVERIFIED',
  PROVISIONER_AUTH_FAILED: 'PROVISIONER_AUTH_FAILED',
  GENERATION_ANOMALY: 'GENERATION_ANOMALY',
  // A release command refused by the release guard before any DELETE: it does not describe the
  // cleanup the database knows (forged, or mismatched with the run it names).
  RELEASE_SCOPE_MISMATCH: 'RELEASE_SCOPE_MISMATCH',
  RELEASE_RUN_NOT_ROOT: 'RELEASE_RUN_NOT_ROOT',
  RELEASE_RUN_NOT_TERMINAL: 'RELEASE_RUN_NOT_TERMINAL',
  RELEASE_SANDBOX_MISMATCH: 'RELEASE_SANDBOX_MISMATCH',
  // The chain restarted at phase 1 too often in a row (identity changed, scope busy or sandbox
  // moved at the release): something keeps disagreeing, and another lap would be another DELETE.
  IDENTITY_UNSTABLE: 'IDENTITY_UNSTABLE',
  // Operator actions (force-clear, retry) refused; nothing was changed.
  REASON_INVALID: 'REASON_INVALID',
  RUN_NOT_ROOT: 'RUN_NOT_ROOT',
  FENCE_NOT_PENDING: 'FENCE_NOT_PENDING',
  RUN_NOT_TERMINAL: 'RUN_NOT_TERMINAL',
  SCOPE_ACTIVE: 'SCOPE_ACTIVE',
  DELETE_IN_FLIGHT: 'DELETE_IN_FLIGHT',
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

export abstract class CleanupError extends Error {
  /** A protocol code (ErrorCode) or an infrastructure one (`adapters/errors.ts`). */
  abstract readonly code: string;
  abstract readonly retryable: boolean;
  /** Structured facts for logs and dead-letter reasons; never secrets. */
  readonly details: Readonly<Record<string, unknown>>;
  /**
   * The earliest next attempt the failing side asked for, in whole seconds from now (a
   * provisioner's `Retry-After`). The consumer waits at least this long, within its backoff cap.
   */
  readonly retryAfterSeconds: number | undefined;
  #deleteMayStillAct: boolean;

  constructor(
    message: string,
    details: Record<string, unknown> = {},
    options?: { cause?: unknown; retryAfterSeconds?: number | undefined; deleteMayStillAct?: boolean },
  ) {
    super(message, options && 'cause' in options ? { cause: options.cause } : undefined);
    this.name = new.target.name;
    this.details = details;
    this.retryAfterSeconds = options?.retryAfterSeconds;
    this.#deleteMayStillAct = options?.deleteMayStillAct ?? true;
  }

  /**
   * For a failure of a sandbox DELETE: whether the provisioner may still carry that DELETE out
   * after this failure. Decided once, where the facts are known — by the provisioner client (it
   * alone knows whether a request left this process and whether an answer came back) and by the
   * provider's keyed lock (a wait that ended before anything was sent) — and read by the one
   * delete path (guarded-delete.ts), which keeps the scope quarantined while it is true.
   *
   * True unless a site that knows better says otherwise: a failure nobody classified must be
   * assumed to leave the DELETE acting, since a wrong "no" reopens a scope under a DELETE that can
   * still land.
   */
  get deleteMayStillAct(): boolean {
    return this.#deleteMayStillAct;
  }

  /**
   * Marks `error` as leaving a DELETE that may still act, whatever it said so far. The provisioner
   * client's, for two cases: the failure of a request retried after an earlier request of the same
   * DELETE went unanswered (a reset after it may have been written), and the caller's own abort
   * reason when it aborted a request on the wire (the same reason ends a wait for the keyed lock,
   * before anything was sent, as "nothing sent").
   */
  static markMayStillAct<E extends CleanupError>(error: E): E {
    error.#deleteMayStillAct = true;
    return error;
  }
}

/**
 * Whether a failed DELETE may still be carried out by the provisioner (see
 * `CleanupError.deleteMayStillAct`); anything that is not a CleanupError is a bug nobody
 * classified, and counts as "may still act".
 */
export function deleteMayStillAct(error: unknown): boolean {
  return !(error instanceof CleanupError) || error.deleteMayStillAct;
}

/** A queue body that can never be processed: bad JSON, wrong shape, hostile values. */
export class InvalidMessageError extends CleanupError {
  readonly code = ErrorCode.MESSAGE_INVALID;
  readonly retryable = false;
}

export class RunNotFoundError extends CleanupError {
  readonly code = ErrorCode.RUN_NOT_FOUND;
  readonly retryable = false;
  constructor(readonly runId: string) {
    super(`agent run ${JSON.stringify(runId)} does not exist`, { runId });
  }
}

/** The run's conversation is missing or belongs to another uid: no retry can fix the data. */
export class OwnershipConflictError extends CleanupError {
  readonly code = ErrorCode.OWNERSHIP_CONFLICT;
  readonly retryable = false;
}

/** The provider's keyed lock for the scope was not acquired in time; the delete was never sent. */
export class ReleaseLockTimeoutError extends CleanupError {
  readonly code = ErrorCode.RELEASE_LOCK_TIMEOUT;
  readonly retryable = true;
}

export class ProvisionerDeleteTimeoutError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_DELETE_TIMEOUT;
  readonly retryable = true;
}

/** The whole release (lock wait + delete) ran past its deadline and was aborted. */
export class CleanupTimeoutError extends CleanupError {
  readonly code = ErrorCode.CLEANUP_TIMEOUT;
  readonly retryable = true;
}

/** 5xx or 408: the provisioner could not answer now; a 503 may say when to come back. */
export class ProvisionerUnavailableError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_UNAVAILABLE;
  readonly retryable = true;
}

/** 429: the provisioner asks us to slow down, possibly saying until when (`retryAfterSeconds`). */
export class ProvisionerThrottledError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_THROTTLED;
  readonly retryable = true;
}

export class ProvisionerConnectionError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_CONNECTION;
  readonly retryable = true;
}

/**
 * A 4xx other than 401 (authentication), 404/410 (gone), 408/429 (retryable) and 409 (generations): the request itself
 * is wrong and resending it cannot help.
 */
export class ProvisionerRejectedError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_REJECTED;
  readonly retryable = false;
}

/** A reply outside the contract (unexpected status, unparsable or oversized 409 body). */
export class ProvisionerBadResponseError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_BAD_RESPONSE;
  readonly retryable = false;
}

/**
 * A 200 that does not confirm the delete: its body is not a JSON object (an HTML page from a
 * catch-all server at a wrong SANDBOX_PROVISIONER_URL, an empty body, JSON of another shape).
 * Counting it as deleted would clear every fence while every sandbox lives; no retry can fix a
 * wrong URL, so it is dead-lettered with this reason.
 */
export class ProvisionerUnconfirmedError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_UNCONFIRMED;
  readonly retryable = false;
}

/**
 * A 404 or 410 ("no such sandbox") from a base URL that is not known to be the provisioner: its
 * `GET /api/sandboxes` did not answer with a listing (contract v1.2, section 3). A web framework
 * answers a route it does not serve with a JSON 404 of its own (FastAPI: `{"detail":"Not
 * Found"}`), so with SANDBOX_PROVISIONER_URL one path segment off, every DELETE hears a 404 that
 * looks like the provisioner's; read as "gone", every fence would clear while every sandbox lives.
 * No retry can fix a wrong URL: dead-lettered at once, with a reason that names the URL and what
 * its listing answered.
 */
export class ProvisionerUrlUnverifiedError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_URL_UNVERIFIED;
  readonly retryable = false;
}

/**
 * 401: the provisioner refused the bearer token (or asked for one and none is configured), also
 * after the token was read once more. Retryable, as the database's DATABASE_AUTH_FAILED: a token
 * rotated at the provisioner before its parameter (or the other way round) heals within the
 * retries, and a token that never heals dead-letters with this code once the retries run out.
 * The request was refused before it acted, so nothing of it can still act.
 */
export class ProvisionerAuthenticationError extends CleanupError {
  readonly code = ErrorCode.PROVISIONER_AUTH_FAILED;
  readonly retryable = true;
}

/**
 * The chain restarted at phase 1 MAX_RESTARTS times in a row and would restart again: a cause that
 * persists (the platform re-creating the sandbox of a fenced scope after each delete, an identity
 * two readers disagree about). Dead-lettered with this reason; the fence stays up for the sweeper
 * and an operator.
 */
export class IdentityUnstableError extends CleanupError {
  readonly code = ErrorCode.IDENTITY_UNSTABLE;
  readonly retryable = false;
}

/** 409 with a current generation older than the one we were asked to delete. */
export class GenerationAnomalyError extends CleanupError {
  readonly code = ErrorCode.GENERATION_ANOMALY;
  readonly retryable = false;
}

export type ReleaseRefusalCode =
  | typeof ErrorCode.RELEASE_SCOPE_MISMATCH
  | typeof ErrorCode.RELEASE_RUN_NOT_ROOT
  | typeof ErrorCode.RELEASE_RUN_NOT_TERMINAL
  | typeof ErrorCode.RELEASE_SANDBOX_MISMATCH;

/**
 * A release command the release guard refused before any DELETE was sent: its uid, scope, sandbox
 * or generation is not the cleanup the database knows for its run, or the run is not a terminal
 * root run. Resending it cannot help: it is dead-lettered at once, with its own code.
 */
export class ReleaseRefusedError extends CleanupError {
  readonly retryable = false;
  constructor(
    readonly code: ReleaseRefusalCode,
    message: string,
    details: Record<string, unknown> = {},
  ) {
    super(message, details);
  }
}

export type OperationRefusalCode =
  | typeof ErrorCode.REASON_INVALID
  | typeof ErrorCode.RUN_NOT_ROOT
  | typeof ErrorCode.FENCE_NOT_PENDING
  | typeof ErrorCode.RUN_NOT_TERMINAL
  | typeof ErrorCode.SCOPE_ACTIVE
  | typeof ErrorCode.DELETE_IN_FLIGHT;

/**
 * An operator action (force-clear, retry) that the run's state does not allow. Checked under the
 * scope's locks where it changes data, so the refusal is about the state the change would have met.
 */
export class OperationRefusedError extends CleanupError {
  readonly retryable = false;
  constructor(
    readonly code: OperationRefusalCode,
    message: string,
    details: Record<string, unknown> = {},
  ) {
    super(message, details);
  }
}

export function isCleanupError(error: unknown): error is CleanupError {
  return error instanceof CleanupError;
}
