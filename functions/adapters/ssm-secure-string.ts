import { GetParameterCommand, type GetParameterCommandOutput, SSMClient } from '@aws-sdk/client-ssm';
import type { CleanupError } from '../cleanup/errors.ts';
import { type AwsTimeouts, boundedAwsClientOptions } from './aws-clients.ts';
import { redactSecrets } from './redact.ts';

/**
 * A secret a function reads at cold start and keeps for the container's life: the database's
 * connection string (adapters/database-url.ts) and the provisioner's bearer token
 * (adapters/provisioner-token.ts). Both follow one rotation story: when the other side rejects
 * the credential, it is read once more, and the work is tried again only if it changed.
 */
export interface SecretSource {
  /** Where the value comes from, for messages: never the value itself. */
  readonly origin: string;
  /**
   * The value. A composition root asks once, at cold start, and the function keeps it for the
   * container's life (lambdaEntry builds once).
   */
  current(): Promise<string>;
  /** Reads it again, for when the other side rejected it (a rotation). Overlapping calls share one read. */
  reread(): Promise<string>;
}

/** A value given as is, in the environment (local stack, tests, CLIs): reading it again gives the same. */
export function fixedSecret(origin: string, value: string): SecretSource {
  return { origin, current: async () => value, reread: async () => value };
}

/**
 * The SSM client of the deployed functions: region and credentials from the Lambda environment,
 * AWS_ENDPOINT_URL_SSM (the SDK's own override) for a local endpoint in tests, and bounded calls,
 * so a cold start whose SSM endpoint never answers fails with the secret's "unreadable" error
 * instead of hanging until Lambda's timeout.
 */
export function createSsmClient(timeouts?: AwsTimeouts): SSMClient {
  return new SSMClient(boundedAwsClientOptions(timeouts));
}

export interface SsmSecureStringOptions {
  client: SSMClient;
  parameterName: string;
  /** What the value is, for the type refusal: "store <valueName> as a SecureString". */
  valueName: string;
  /** Why the value is unusable, without showing it, or undefined when it is fine. */
  refuse(value: string): string | undefined;
  /** The secret's own "cannot read it" failure; `reason` never holds the value. */
  unreadable(reason: string, cause?: unknown): CleanupError;
}

/**
 * A value from an SSM SecureString parameter, decrypted by SSM (the function's role may call
 * `ssm:GetParameter` on that parameter and `kms:Decrypt` only through SSM). A parameter of type
 * `String` is refused: the point is that the secret is never stored in plain text. SSM rather than
 * Secrets Manager: a standard parameter costs nothing and the deployment already names its
 * settings by SSM path.
 */
export function ssmSecureString(options: SsmSecureStringOptions): SecretSource {
  const { client, parameterName, valueName, refuse, unreadable } = options;
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
      throw unreadable(`it is of type ${parameter?.Type ?? 'unknown'}; store ${valueName} as a SecureString`);
    }
    const value = parameter.Value?.trim() ?? '';
    const refusal = refuse(value);
    if (refusal !== undefined) throw unreadable(refusal);
    return value;
  };

  let rereading: Promise<string> | undefined;
  return {
    origin: `SSM parameter ${parameterName}`,
    current: read,
    reread() {
      rereading ??= read().finally(() => {
        rereading = undefined;
      });
      return rereading;
    },
  };
}
