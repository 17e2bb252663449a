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

export class QueueUnavailableError extends CleanupError {
  readonly code = InfrastructureErrorCode.QUEUE_UNAVAILABLE;
  readonly retryable = true;
}
