import { SandboxProvider } from '../cleanup/sandbox-provider.ts';
import { type CleanupConfig, loadConfig, requireDeploymentValues } from './config.ts';
import { type Database, openDatabase } from './database.ts';
import { createTelemetry, type Telemetry } from './observability.ts';
import { ProvisionerClient } from './provisioner-client.ts';
import { createQueues, type Queues } from './queues.ts';

/**
 * What the handlers run on. Deployed, each function builds its own once per cold start from the
 * environment; the local stack builds one set and hands it to every handler it invokes.
 */
export interface Dependencies {
  config: CleanupConfig;
  db: Database;
  queues: Queues;
  provider: SandboxProvider;
  telemetry: Telemetry;
}

export function createProvider(config: CleanupConfig, provisionerUrl: string): SandboxProvider {
  return new SandboxProvider({
    client: new ProvisionerClient(provisionerUrl),
    releaseLockTimeoutMs: config.releaseLockTimeoutSeconds * 1000,
    provisionerDeleteTimeoutMs: config.provisionerDeleteTimeoutSeconds * 1000,
  });
}

/** The deployed path: configuration from the environment, validated before anything is processed. */
export async function dependenciesFromEnvironment(functionName: string): Promise<Dependencies> {
  const config = loadConfig();
  requireDeploymentValues(config);
  const telemetry = createTelemetry({ functionName });
  const db = await openDatabase({
    url: config.databaseUrl!,
    // One Lambda instance handles one batch at a time; a few connections cover a batch's records.
    maxConnections: 5,
    lockTimeoutMs: config.databaseLockTimeoutMs,
    statementTimeoutMs: config.databaseStatementTimeoutMs,
    connectTimeoutMs: config.databaseConnectTimeoutMs,
    queryTimeoutMs: config.databaseQueryTimeoutMs,
    onIdleError: (error) =>
      telemetry.logger.warn('idle database connection failed', { error: error.message }),
  });
  return {
    config,
    db,
    queues: createQueues({
      prefix: config.queueNamePrefix,
      ...(config.sqsEndpoint ? { endpoint: config.sqsEndpoint } : {}),
    }),
    provider: createProvider(config, config.provisionerUrl!),
    telemetry,
  };
}
