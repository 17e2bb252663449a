import type { SSMClient } from '@aws-sdk/client-ssm';
import { DatabaseUrlUnreadableError } from './errors.ts';
import { fixedSecret, type SecretSource, ssmSecureString } from './ssm-secure-string.ts';

export { createSsmClient } from './ssm-secure-string.ts';

/**
 * Where a function gets its connection string. Deployed, it lives in an SSM SecureString
 * parameter (encrypted with the stack's own KMS key) and is read at cold start: a plain `String`
 * resolved into the Lambda environment would show the password to anyone allowed
 * `lambda:GetFunctionConfiguration`, and CloudFormation does not resolve `ssm-secure` references
 * in Lambda environment variables. Neon has no rotation integration that Secrets Manager would
 * add. Locally and in tests a plain DATABASE_URL is used as it is. `reread` is for when the
 * database rejected the credentials (a rotated password).
 */
export type DatabaseUrlSource = SecretSource;

/** DATABASE_URL given as is (local stack, tests, CLIs). */
export function fixedDatabaseUrl(url: string): DatabaseUrlSource {
  return fixedSecret('DATABASE_URL', url);
}

/** A PostgreSQL URL as the Neon driver accepts it (not libpq's `host=… password=…` form). */
function isPostgresUrl(value: string): boolean {
  try {
    const url = new URL(value);
    return (url.protocol === 'postgres:' || url.protocol === 'postgresql:') && url.hostname !== '';
  } catch {
    return false;
  }
}

/** The connection string from an SSM SecureString parameter (the shared reader, ssm-secure-string.ts). */
export function ssmDatabaseUrl(options: { client: SSMClient; parameterName: string }): DatabaseUrlSource {
  const { client, parameterName } = options;
  return ssmSecureString({
    client,
    parameterName,
    valueName: 'the connection string',
    refuse: (value) =>
      isPostgresUrl(value)
        ? undefined
        : 'its value is not a postgres:// or postgresql:// URL (value not shown)',
    unreadable: (reason, cause) =>
      new DatabaseUrlUnreadableError(
        `cannot read DATABASE_URL from SSM parameter ${parameterName}: ${reason}`,
        { parameterName },
        cause === undefined ? undefined : { cause },
      ),
  });
}
