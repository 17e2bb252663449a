import type { CleanupConfig } from '../../functions/adapters/config.ts';
import type { FunctionKey } from '../../functions/adapters/connection-budget.ts';
import type { Database } from '../../functions/adapters/database.ts';
import type { Infrastructure } from '../../functions/adapters/infrastructure.ts';
import type { Telemetry } from '../../functions/adapters/observability.ts';
import { provisionerTokenSource } from '../../functions/adapters/provisioner-token.ts';
import type { Queues } from '../../functions/adapters/queues.ts';

/**
 * What a test hands a function's composition root (`composeRelease(…)` and the others): the
 * test's own database, queues and telemetry. The handler under test is then wired exactly as the
 * deployed one and the local stack's are.
 */
export function testInfrastructure(parts: {
  config: CleanupConfig;
  db: Database;
  queues: Queues;
  telemetry: Telemetry | Partial<Record<FunctionKey, Telemetry>>;
  maxReceiveCounts?: Partial<Record<string, number>>;
}): Infrastructure {
  const { config, db, queues, telemetry } = parts;
  return {
    config,
    telemetry(functionKey) {
      if ('logger' in telemetry) return telemetry as Telemetry;
      const found = (telemetry as Partial<Record<FunctionKey, Telemetry>>)[functionKey];
      if (!found) throw new Error(`the test gave no telemetry for ${functionKey}`);
      return found;
    },
    database: async () => db,
    queues: () => queues,
    provisionerToken: () => provisionerTokenSource(config),
    ...(parts.maxReceiveCounts ? { maxReceiveCounts: parts.maxReceiveCounts } : {}),
  };
}
