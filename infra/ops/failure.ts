/**
 * Every error a command can end with, mapped to a stable code, one line for people (secrets
 * redacted: connection errors may quote a URL) and the exit code scripts branch on.
 */
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { redactSecrets } from '../../functions/adapters/redact.ts';
import { ErrorCode, isCleanupError } from '../../functions/cleanup/errors.ts';
import { isOpsError } from './errors.ts';
import { ExitCode } from './exit-codes.ts';

const EXIT_CODE_OF_CLEANUP_ERROR: Partial<Record<string, ExitCode>> = {
  [InfrastructureErrorCode.CONFIG_INVALID]: ExitCode.USAGE,
  [ErrorCode.REASON_INVALID]: ExitCode.USAGE,
  [ErrorCode.RUN_NOT_FOUND]: ExitCode.REFUSED,
  [ErrorCode.RUN_NOT_ROOT]: ExitCode.REFUSED,
  [ErrorCode.FENCE_NOT_PENDING]: ExitCode.REFUSED,
  [ErrorCode.RUN_NOT_TERMINAL]: ExitCode.REFUSED,
  [ErrorCode.SCOPE_ACTIVE]: ExitCode.REFUSED,
  [InfrastructureErrorCode.DATABASE_UNAVAILABLE]: ExitCode.UNREACHABLE,
  // A refused login (a wrong or missing password): the database cannot be used, like one down.
  [InfrastructureErrorCode.DATABASE_AUTH_FAILED]: ExitCode.UNREACHABLE,
  [InfrastructureErrorCode.QUEUE_UNAVAILABLE]: ExitCode.UNREACHABLE,
  // --stage: the database URL's SSM parameter is missing, not a SecureString, or not ours to read.
  [InfrastructureErrorCode.DATABASE_URL_UNREADABLE]: ExitCode.UNREACHABLE,
  [InfrastructureErrorCode.DATABASE_LOCK_TIMEOUT]: ExitCode.BUSY,
  [ErrorCode.DELETE_IN_FLIGHT]: ExitCode.BUSY,
};

export interface Failure {
  code: string;
  message: string;
  exitCode: ExitCode;
}

/** What the CLI reports for an error: a stable code, one redacted line, the exit code. */
export function describeFailure(error: unknown): Failure {
  if (isOpsError(error)) {
    return { code: error.code, message: redactSecrets(error.message), exitCode: error.exitCode };
  }
  if (isCleanupError(error)) {
    return {
      code: error.code,
      message: redactSecrets(error.message),
      exitCode: EXIT_CODE_OF_CLEANUP_ERROR[error.code] ?? ExitCode.INTERNAL,
    };
  }
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return { code: 'UNEXPECTED', message: redactSecrets(message), exitCode: ExitCode.INTERNAL };
}
