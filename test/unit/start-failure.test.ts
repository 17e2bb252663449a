import { describe, expect, it } from 'vitest';
import { DatabaseUnavailableError } from '../../functions/adapters/errors.ts';
import { PostgresInUseError } from '../../infra/local/errors.ts';
import { describeStartFailure } from '../../infra/local/start-failure.ts';

/** The local stack's start failures, as errors really arrive (shapes taken from the AWS SDK and Node). */
function refused(address: string, port: number): Error {
  return Object.assign(new Error(`connect ECONNREFUSED ${address}:${port}`), {
    code: 'ECONNREFUSED',
    address,
    port,
  });
}

describe('describeStartFailure', () => {
  it('names AWS_ENDPOINT_URL_SQS and the two ways out when that endpoint refuses', () => {
    const line = describeStartFailure(refused('127.0.0.1', 4566), {
      AWS_ENDPOINT_URL_SQS: 'http://127.0.0.1:4566',
    });
    expect(line).toBe(
      'AWS_ENDPOINT_URL_SQS=http://127.0.0.1:4566 does not answer (connect ECONNREFUSED 127.0.0.1:4566): start that SQS endpoint, or unset AWS_ENDPOINT_URL_SQS and the stack starts its own emulator',
    );
  });

  it('recognises localhost, which Node tries on ::1 and 127.0.0.1 (an AggregateError)', () => {
    const error = Object.assign(new AggregateError([refused('::1', 4566), refused('127.0.0.1', 4566)], ''), {
      code: 'ECONNREFUSED',
    });
    expect(describeStartFailure(error, { AWS_ENDPOINT_URL_SQS: 'http://localhost:4566' })).toContain(
      'AWS_ENDPOINT_URL_SQS=http://localhost:4566 does not answer',
    );
  });

  it('recognises a host that does not resolve', () => {
    const error = Object.assign(new Error('getaddrinfo ENOTFOUND sqs.nowhere.invalid'), {
      code: 'ENOTFOUND',
      hostname: 'sqs.nowhere.invalid',
    });
    expect(
      describeStartFailure(error, { AWS_ENDPOINT_URL_SQS: 'http://sqs.nowhere.invalid:4566' }),
    ).toContain('unset AWS_ENDPOINT_URL_SQS');
  });

  it('leaves a refusal from another address alone: it is not that endpoint', () => {
    expect(
      describeStartFailure(refused('127.0.0.1', 5432), { AWS_ENDPOINT_URL_SQS: 'http://127.0.0.1:4566' }),
    ).toBe('connect ECONNREFUSED 127.0.0.1:5432');
  });

  it('names DATABASE_URL (its password hidden) when the database cannot be reached', () => {
    const line = describeStartFailure(
      new DatabaseUnavailableError('database connection failed: getaddrinfo ENOTFOUND db.invalid'),
      { DATABASE_URL: 'postgres://app:s3cret@db.invalid/x' },
    );
    expect(line).toContain('DATABASE_URL=postgres://app:***@db.invalid/x cannot be reached');
    expect(line).toContain('unset DATABASE_URL and the stack starts an embedded PostgreSQL');
    expect(line).not.toContain('s3cret');
  });

  it("prints the local stack's own errors as they are", () => {
    expect(describeStartFailure(new PostgresInUseError(42, '/data/pgdata'), {})).toBe(
      new PostgresInUseError(42, '/data/pgdata').message,
    );
  });
});
