/**
 * Failures of the infrastructure the protocol runs on: configuration, the database, the queues.
 * They extend the protocol's CleanupError so that one rule (`code` and `retryable`) decides
 * between retry and dead letter everywhere; the protocol itself never names them.
 */
import { CleanupError } from '../cleanup/errors.ts';

export const InfrastructureErrorCode = {
  CONFIG_INVALID: 'CONFIG_INVALID',
  DATABASE_UNAVAILABLE: 'DATABASE_UNAVAILABLE',
  DATABASE_LOCK_TIMEOUT: 'DATABASE_LOCK_TIMEOUT',
  DATABASE_AUTH_FAILED: 'DATABASE_AUTH_FAILED',
  DATABASE_URL_UNREADABLE: 'DATABASE_URL_UNREADABLE',
  PROVISIONER_TOKEN_UNREADABLE: 'PROVISIONER_TOKEN_UNREADABLE',
  QUEUE_UNAVAILABLE: 'QUEUE_UNAVAILABLE',
} as const;
export type InfrastructureErrorCode = (typeof InfrastructureErrorCode)[keyof typeof InfrastructureErrorCode];

export class ConfigError extends CleanupError {
  readonly code = InfrastructureErrorCode.CONFIG_INVALID;
  readonly retryable = false;
  constructor(
    readonly variable: string,
    readonly value: string,
    readonly rule: string,
  ) {
    super(`${variable}=${JSON.stringify(value)} is invalid: ${rule}`, { variable, rule });
  }
}

export class DatabaseUnavailableError extends CleanupError {
  readonly code = InfrastructureErrorCode.DATABASE_UNAVAILABLE;
  readonly retryable = true;
}

export class DatabaseLockTimeoutError extends CleanupError {
  readonly code = InfrastructureErrorCode.DATABASE_LOCK_TIMEOUT;
  readonly retryable = true;
}

/**
 * The database refused the credentials (SQLSTATE 28P01 or 28000), even after the connection
 * string was read again once: a rotation not finished yet, or a wrong secret. Retryable, so the
 * work comes back with backoff while an operator fixes the secret, and dead-letters with this code
 * if it never heals.
 */
export class DatabaseAuthenticationError extends CleanupError {
  readonly code = InfrastructureErrorCode.DATABASE_AUTH_FAILED;
  readonly retryable = true;
}

/**
 * The connection string could not be read from where the deployment keeps it (an SSM
 * SecureString). The message names the parameter and the reason, never the value.
 */
export class DatabaseUrlUnreadableError extends CleanupError {
  readonly code = InfrastructureErrorCode.DATABASE_URL_UNREADABLE;
  readonly retryable = true;
}

/**
 * The provisioner's bearer token could not be read from its SSM SecureString
 * (SANDBOX_PROVISIONER_TOKEN_PARAMETER). The message names the parameter and the reason, never
 * the value. Retryable, as DATABASE_URL_UNREADABLE: at cold start the invocation fails and Lambda
 * tries again; on a re-read after a 401, the record comes back with backoff.
 */
export class ProvisionerTokenUnreadableError extends CleanupError {
  readonly code = InfrastructureErrorCode.PROVISIONER_TOKEN_UNREADABLE;
  readonly retryable = true;
}

export class QueueUnavailableError extends CleanupError {
  readonly code = InfrastructureErrorCode.QUEUE_UNAVAILABLE;
  readonly retryable = true;
}
