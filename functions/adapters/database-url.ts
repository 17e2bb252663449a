import { GetParameterCommand, type GetParameterCommandOutput, SSMClient } from '@aws-sdk/client-ssm';
import { type AwsTimeouts, boundedAwsClientOptions } from './aws-clients.ts';
import { DatabaseUrlUnreadableError } from './errors.ts';
import { redactSecrets } from './redact.ts';

/**
 * Where a function gets its connection string. Deployed, it lives in an SSM SecureString
 * parameter (encrypted with the stack's own KMS key) and is read at cold start: a plain `String`
 * resolved into the Lambda environment would show the password to anyone allowed
 * `lambda:GetFunctionConfiguration`, and CloudFormation does not resolve `ssm-secure` references
 * in Lambda environment variables. SSM rather than Secrets Manager: a standard parameter costs
 * nothing, the deployment already names its settings by SSM path, and Neon has no rotation
 * integration that Secrets Manager would add. Locally and in tests a plain DATABASE_URL is used
 * as it is.
 */
export interface DatabaseUrlSource {
  /** Where the value comes from, for messages: never the value itself. */
  readonly origin: string;
  /**
   * The connection string. A composition root asks once, at cold start, and the function keeps
   * it for the container's life (lambdaEntry builds once).
   */
  current(): Promise<string>;
  /**
   * Reads it again, for when the database rejected the credentials (a rotated password). Calls
   * that overlap share one read.
   */
  reread(): Promise<string>;
}

/** DATABASE_URL given as is (local stack, tests, CLIs). */
export function fixedDatabaseUrl(url: string): DatabaseUrlSource {
  return { origin: 'DATABASE_URL', current: async () => url, reread: async () => url };
}

/**
 * The SSM client of the deployed functions: region and credentials from the Lambda environment,
 * AWS_ENDPOINT_URL_SSM (the SDK's own override) for a local endpoint in tests, and bounded calls,
 * so a cold start whose SSM endpoint never answers fails with DATABASE_URL_UNREADABLE instead of
 * hanging until Lambda's timeout.
 */
export function createSsmClient(timeouts?: AwsTimeouts): SSMClient {
  return new SSMClient(boundedAwsClientOptions(timeouts));
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

/**
 * The connection string from an SSM SecureString parameter, decrypted by SSM (the function's role
 * may call `ssm:GetParameter` on that parameter and `kms:Decrypt` only through SSM). A parameter
 * of type `String` is refused: the point is that the password is never stored in plain text.
 */
export function ssmDatabaseUrl(options: { client: SSMClient; parameterName: string }): DatabaseUrlSource {
  const { client, parameterName } = options;
  const origin = `SSM parameter ${parameterName}`;
  const unreadable = (reason: string, cause?: unknown) =>
    new DatabaseUrlUnreadableError(
      `cannot read DATABASE_URL from SSM parameter ${parameterName}: ${reason}`,
      { parameterName },
      cause === undefined ? undefined : { cause },
    );

  const read = async (): Promise<string> => {
    let answer: GetParameterCommandOutput;
    try {
      answer = await client.send(new GetParameterCommand({ Name: parameterName, WithDecryption: true }));
    } catch (error) {
      // The SDK's error name says what went wrong (ParameterNotFound, AccessDeniedException, a
      // KMS failure); its message names ARNs at most. One line, whatever it holds.
      const name = (error as Error)?.name ?? 'Error';
      const message = String((error as Error)?.message ?? '').replace(/\s+/g, ' ');
      throw unreadable(redactSecrets(message ? `${name}: ${message}` : name).slice(0, 300), error);
    }
    const parameter = answer.Parameter;
    if (parameter?.Type !== 'SecureString') {
      throw unreadable(
        `it is of type ${parameter?.Type ?? 'unknown'}; store the connection string as a SecureString`,
      );
    }
    const value = parameter.Value?.trim() ?? '';
    if (!isPostgresUrl(value)) {
      throw unreadable('its value is not a postgres:// or postgresql:// URL (value not shown)');
    }
    return value;
  };

  let rereading: Promise<string> | undefined;
  return {
    origin,
    current: read,
    reread() {
      rereading ??= read().finally(() => {
        rereading = undefined;
      });
      return rereading;
    },
  };
}
