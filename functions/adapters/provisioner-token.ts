import type { SSMClient } from '@aws-sdk/client-ssm';
import { bearerTokenRefusal, type CleanupConfig } from './config.ts';
import { ConfigError, ProvisionerTokenUnreadableError } from './errors.ts';
import { fixedSecret, type SecretSource, ssmSecureString } from './ssm-secure-string.ts';

/**
 * Where the provisioner's bearer token comes from (contract v1.2, section 4), or undefined when
 * none is configured (the provisioner then gets no Authorization header). Deployed: the SSM
 * SecureString SANDBOX_PROVISIONER_TOKEN_PARAMETER names, read at cold start with the same reader
 * and the same rotation story as DATABASE_URL_PARAMETER (a 401 reads it once more). Locally and in
 * tests: SANDBOX_PROVISIONER_TOKEN as is.
 *
 * `ssm` is given only where SSM may be read (the deployed functions). Elsewhere (the local stack,
 * the operator's commands) a parameter without a token is refused: quietly sending no token would
 * fail every request with a 401 that names nothing.
 */
export function provisionerTokenSource(
  config: Pick<CleanupConfig, 'provisionerToken' | 'provisionerTokenParameter'>,
  ssm?: () => SSMClient,
): SecretSource | undefined {
  if (config.provisionerToken) return fixedSecret('SANDBOX_PROVISIONER_TOKEN', config.provisionerToken);
  const parameterName = config.provisionerTokenParameter;
  if (!parameterName) return undefined;
  if (!ssm) {
    throw new ConfigError(
      'SANDBOX_PROVISIONER_TOKEN',
      '',
      `is required here: this command does not read SANDBOX_PROVISIONER_TOKEN_PARAMETER; export it from the parameter first (SANDBOX_PROVISIONER_TOKEN="$(aws ssm get-parameter --with-decryption --name ${parameterName} --query Parameter.Value --output text)")`,
    );
  }
  return ssmSecureString({
    client: ssm(),
    parameterName,
    valueName: 'the token',
    refuse: (value) => {
      const refusal = bearerTokenRefusal(value);
      return refusal === undefined ? undefined : `its value ${refusal}`;
    },
    unreadable: (reason, cause) =>
      new ProvisionerTokenUnreadableError(
        `cannot read SANDBOX_PROVISIONER_TOKEN from SSM parameter ${parameterName}: ${reason}`,
        { parameterName },
        cause === undefined ? undefined : { cause },
      ),
  });
}
