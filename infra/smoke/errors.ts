/**
 * Why a smoke check did not pass, once everything it needs was reached: the cleanup did not
 * announce the run on runtime-cleaned in time, or what it announced does not hold (the fence is
 * still up, the sandbox still live). `code` is stable; the message says where to look.
 */
export class SmokeCheckFailedError extends Error {
  readonly code = 'SMOKE_CHECK_FAILED';
  constructor(message: string) {
    super(message);
    this.name = 'SmokeCheckFailedError';
  }
}

/** The command line or the environment cannot make a target (a stage without DATABASE_URL). */
export class SmokeUsageError extends Error {
  readonly code = 'SMOKE_USAGE';
  constructor(message: string) {
    super(message);
    this.name = 'SmokeUsageError';
  }
}
