/**
 * Failures of the operator CLI itself (the protocol's own failures are the CleanupError classes
 * of functions/cleanup/errors.ts). Each carries a stable code and the exit code it ends with.
 */
import { ExitCode } from './exit-codes.ts';

export const OpsErrorCode = {
  USAGE: 'USAGE',
  SCHEMA_NOT_MIGRATED: 'SCHEMA_NOT_MIGRATED',
  DATABASE_NOT_FOUND: 'DATABASE_NOT_FOUND',
  DATABASE_LOGIN_REFUSED: 'DATABASE_LOGIN_REFUSED',
  DATABASE_READ_ONLY: 'DATABASE_READ_ONLY',
  DATABASE_LOCKED: 'DATABASE_LOCKED',
  SCOPE_BLOCKED: 'SCOPE_BLOCKED',
  NO_SETTINGS_OF_RECORD: 'NO_SETTINGS_OF_RECORD',
} as const;
export type OpsErrorCode = (typeof OpsErrorCode)[keyof typeof OpsErrorCode];

export abstract class OpsError extends Error {
  abstract readonly code: OpsErrorCode;
  abstract readonly exitCode: ExitCode;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Unknown command, unknown option, missing argument, bad value: nothing was attempted. */
export class UsageError extends OpsError {
  readonly code = OpsErrorCode.USAGE;
  readonly exitCode = ExitCode.USAGE;
}

/** The database answers but lacks a table or function of this project: `npm run migrate` was not run. */
export class SchemaNotMigratedError extends OpsError {
  readonly code = OpsErrorCode.SCHEMA_NOT_MIGRATED;
  readonly exitCode = ExitCode.UNREACHABLE;
}

/** The server answers but has no database of that name: DATABASE_URL names the wrong one. */
export class DatabaseNotFoundError extends OpsError {
  readonly code = OpsErrorCode.DATABASE_NOT_FOUND;
  readonly exitCode = ExitCode.UNREACHABLE;
}

/** The server answers but refuses the login (password, user, or pg_hba.conf). */
export class DatabaseLoginRefusedError extends OpsError {
  readonly code = OpsErrorCode.DATABASE_LOGIN_REFUSED;
  readonly exitCode = ExitCode.UNREACHABLE;
}

/**
 * The server answers but takes no writes: `default_transaction_read_only` is on, or it is a hot
 * standby (a read replica's endpoint). DATABASE_URL names the wrong endpoint: the operator's to fix.
 */
export class DatabaseReadOnlyError extends OpsError {
  readonly code = OpsErrorCode.DATABASE_READ_ONLY;
  readonly exitCode = ExitCode.UNREACHABLE;
}

/**
 * A table the command needs is locked by another session past DATABASE_LOCK_TIMEOUT_MS: the
 * database is up, it is busy. Try again (exit 4), not "unreachable".
 */
export class DatabaseLockedError extends OpsError {
  readonly code = OpsErrorCode.DATABASE_LOCKED;
  readonly exitCode = ExitCode.BUSY;
}

/**
 * force-clear found its own earlier clear done, but the scope is blocked now by another root run's
 * fence: announcing `runtime-cleaned` would tell the platform the scope is clean while it is not.
 * Nothing to redo; the other fence's cleanup announces the scope when it ends. Busy (exit 4).
 */
export class ScopeBlockedError extends OpsError {
  readonly code = OpsErrorCode.SCOPE_BLOCKED;
  readonly exitCode = ExitCode.BUSY;
}

/**
 * `reclaim --yes` in a database where the deployment has recorded no settings of record (its
 * reclaimer never ran there): the only grace and bounds left are this shell's, which need not be
 * the stage's. Refused (exit 1) unless the operator says to use them.
 */
export class NoSettingsOfRecordError extends OpsError {
  readonly code = OpsErrorCode.NO_SETTINGS_OF_RECORD;
  readonly exitCode = ExitCode.REFUSED;
}

export function isOpsError(error: unknown): error is OpsError {
  return error instanceof OpsError;
}
