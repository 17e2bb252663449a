/**
 * The operator CLI's exit codes, a contract with the scripts that call it (documented in
 * `ops help`). Scripts branch on these, never on message text.
 */
export const ExitCode = {
  OK: 0,
  /** The operation was refused or its subject does not exist (unknown run, no pending fence…). */
  REFUSED: 1,
  /** Bad usage or bad configuration: nothing was attempted. */
  USAGE: 2,
  /** The database or SQS could not be reached (or is not set up: schema not migrated, queue missing). */
  UNREACHABLE: 3,
  /**
   * The scope's lock was not had within the lock timeout (a cleanup holds it), or a release's
   * DELETE may still be in flight for the scope: try again later.
   */
  BUSY: 4,
  /** A bug: an error nobody classified. */
  INTERNAL: 5,
} as const;
export type ExitCode = (typeof ExitCode)[keyof typeof ExitCode];
