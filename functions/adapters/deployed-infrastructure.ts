import { loadConfig, requireDatabaseUrlSource } from './config.ts';
import { databasePoolSize } from './connection-budget.ts';
import { openDatabase } from './database.ts';
import { createSsmClient, type DatabaseUrlSource, fixedDatabaseUrl, ssmDatabaseUrl } from './database-url.ts';
import { FUNCTION_LOG_NAMES, type Infrastructure } from './infrastructure.ts';
import { createTelemetry } from './observability.ts';
import { provisionerTokenSource } from './provisioner-token.ts';
import { createQueues, type Queues } from './queues.ts';
import type { SecretSource } from './ssm-secure-string.ts';

/**
 * The deployed functions' infrastructure, built at cold start from the Lambda environment:
 * configuration validated before anything is processed, the connection string read from its SSM
 * SecureString parameter (DATABASE_URL_PARAMETER) and kept for the container's life, a database
 * pool of the function's own size, and the SQS client; the provisioner's token, likewise, from
 * SANDBOX_PROVISIONER_TOKEN_PARAMETER. Nothing connects until first used.
 */
export function deployedInfrastructure(
  env: Readonly<Record<string, string | undefined>> = process.env,
): Infrastructure {
  const config = loadConfig(env);
  requireDatabaseUrlSource(config);
  const urlSource: DatabaseUrlSource = config.databaseUrl
    ? fixedDatabaseUrl(config.databaseUrl)
    : ssmDatabaseUrl({
        // Region and credentials from the Lambda environment; AWS_ENDPOINT_URL_SSM (the SDK's own
        // override) points it at a local endpoint in tests.
        client: createSsmClient(),
        parameterName: config.databaseUrlParameter!,
      });
  let queues: Queues | undefined;
  let tokenSource: SecretSource | undefined;
  return {
    config,
    telemetry: (functionKey) => createTelemetry({ functionName: FUNCTION_LOG_NAMES[functionKey] }),
    async database(functionKey, telemetry) {
      return openDatabase({
        url: await urlSource.current(),
        rereadUrl: () => urlSource.reread(),
        // Unset, the URL read from SSM decides by its host (database-driver.ts).
        driver: config.databaseDriver,
        ...(config.databaseWsProxy ? { wsProxy: config.databaseWsProxy } : {}),
        maxConnections: databasePoolSize(functionKey),
        lockTimeoutMs: config.databaseLockTimeoutMs,
        statementTimeoutMs: config.databaseStatementTimeoutMs,
        connectTimeoutMs: config.databaseConnectTimeoutMs,
        queryTimeoutMs: config.databaseQueryTimeoutMs,
        onIdleError: (error) =>
          telemetry.logger.warn('idle database connection failed', { error: error.message }),
      });
    },
    provisionerToken() {
      tokenSource ??= provisionerTokenSource(config, () => createSsmClient());
      return tokenSource;
    },
    queues() {
      queues ??= createQueues({
        prefix: config.queueNamePrefix,
        ...(config.sqsEndpoint ? { endpoint: config.sqsEndpoint } : {}),
      });
      return queues;
    },
  };
}
