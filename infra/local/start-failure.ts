/**
 * The line a person gets when the local stack cannot start (`npm run stack`, `npm start`): which
 * variable points where and the ways out, instead of a bare socket error such as
 * "connect ECONNREFUSED 127.0.0.1:4566" that names neither.
 */
import { redactUrl } from '../../functions/adapters/config.ts';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { redactSecrets } from '../../functions/adapters/redact.ts';
import { isCleanupError } from '../../functions/cleanup/errors.ts';
import { isLocalStackError } from './errors.ts';

type Env = Readonly<Record<string, string | undefined>>;

/** Node's socket and resolver failures: nothing answered at that address. */
const NO_ANSWER_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'ECONNRESET',
  'EHOSTUNREACH',
  'ENETUNREACH',
]);

interface SocketFailure {
  code?: unknown;
  address?: unknown;
  port?: unknown;
  hostname?: unknown;
  message?: unknown;
}

/** The error, the errors of an AggregateError (localhost tries ::1 and 127.0.0.1), and causes. */
function socketFailuresIn(error: unknown, depth = 0): SocketFailure[] {
  if (typeof error !== 'object' || error === null || depth > 4) return [];
  const failure = error as SocketFailure & { errors?: unknown; cause?: unknown };
  const nested = Array.isArray(failure.errors) ? failure.errors : [];
  return [
    failure,
    ...nested.flatMap((inner) => socketFailuresIn(inner, depth + 1)),
    ...socketFailuresIn(failure.cause, depth + 1),
  ];
}

function isAbout(endpoint: URL, failure: SocketFailure): boolean {
  if (!NO_ANSWER_CODES.has(String(failure.code))) return false;
  const host = endpoint.hostname.replace(/^\[|\]$/g, '');
  const port = Number(endpoint.port || (endpoint.protocol === 'https:' ? 443 : 80));
  if (failure.hostname === host) return true;
  return failure.port === port && (failure.address === host || host === 'localhost');
}

function parsedUrl(text: string): URL | undefined {
  try {
    return new URL(text);
  } catch {
    return undefined;
  }
}

/** A variable's value as the person typed it, unless it carries a secret (then redacted). */
function asGiven(value: string): string {
  const redacted = redactUrl(value);
  return redacted === parsedUrl(value)?.toString() ? value : redacted;
}

export function describeStartFailure(error: unknown, env: Env): string {
  if (isLocalStackError(error)) return error.message;
  const message = redactSecrets(error instanceof Error ? error.message : String(error));
  const sqs = env.AWS_ENDPOINT_URL_SQS ? parsedUrl(env.AWS_ENDPOINT_URL_SQS) : undefined;
  if (sqs && socketFailuresIn(error).some((failure) => isAbout(sqs, failure))) {
    return `AWS_ENDPOINT_URL_SQS=${asGiven(env.AWS_ENDPOINT_URL_SQS!)} does not answer (${message}): start that SQS endpoint, or unset AWS_ENDPOINT_URL_SQS and the stack starts its own emulator`;
  }
  if (
    env.DATABASE_URL &&
    isCleanupError(error) &&
    error.code === InfrastructureErrorCode.DATABASE_UNAVAILABLE
  ) {
    return `DATABASE_URL=${asGiven(env.DATABASE_URL)} cannot be reached (${message}): start that PostgreSQL or correct DATABASE_URL, or unset DATABASE_URL and the stack starts an embedded PostgreSQL`;
  }
  return message;
}
