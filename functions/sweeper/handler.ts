import type { Context } from 'aws-lambda';
import type { CleanupConfig } from '../adapters/config.ts';
import type { Database } from '../adapters/database.ts';
import { deployedInfrastructure } from '../adapters/deployed-infrastructure.ts';
import type { ComposedFunction, Infrastructure } from '../adapters/infrastructure.ts';
import { lambdaEntry } from '../adapters/lambda.ts';
import { MetricName } from '../adapters/metric-names.ts';
import type { Telemetry } from '../adapters/observability.ts';
import type { Queues } from '../adapters/queues.ts';
import { countNewForcedClears } from './forced-clears.ts';
import { type SweepResult, sweepFences } from './sweep.ts';

/**
 * sweeper: on a schedule, re-announces fences pending too long and reports the fence backlog and
 * the forced clears made since its last report.
 */
export function createSweeperHandler(deps: {
  db: Database;
  queues: Queues;
  telemetry: Telemetry;
  config: CleanupConfig;
}): (event: unknown, context: Context) => Promise<SweepResult & { forcedClears: number }> {
  const { telemetry, config } = deps;
  return async () => {
    const result = await sweepFences(deps, { sweepAfterSeconds: config.fenceSweepAfterSeconds });
    const forcedClears = await countNewForcedClears(deps.db);
    telemetry.metrics.addMetric(MetricName.FORCED_CLEARS, 'Count', forcedClears);
    telemetry.metrics.addMetric(MetricName.FENCES_REANNOUNCED, 'Count', result.announced.length);
    telemetry.metrics.addMetric(MetricName.PENDING_FENCES, 'Count', result.pendingFences);
    telemetry.metrics.addMetric(MetricName.OLDEST_FENCE_AGE, 'Seconds', result.oldestFenceAgeSeconds);
    const log = result.failed.length
      ? telemetry.logger.warn.bind(telemetry.logger)
      : telemetry.logger.info.bind(telemetry.logger);
    log('sweep finished', {
      phase: 'sweep',
      reannounced: result.announced.length,
      reannouncedRunIds: result.announced.slice(0, 20),
      failedToAnnounce: result.failed.length,
      pendingFences: result.pendingFences,
      oldestFenceAgeSeconds: result.oldestFenceAgeSeconds,
      forcedClears,
    });
    if (result.failed.length) {
      throw new Error(
        `sweeper could not announce ${result.failed.length} fence(s); they are claimed again next tick`,
      );
    }
    return { ...result, forcedClears };
  };
}

/** The composition root: the sweeper needs the database and the queues, nothing else. */
export async function composeSweeper(
  infrastructure: Infrastructure,
): Promise<ComposedFunction<unknown, SweepResult & { forcedClears: number }>> {
  const telemetry = infrastructure.telemetry('sweeper');
  const db = await infrastructure.database('sweeper', telemetry);
  const handler = createSweeperHandler({
    config: infrastructure.config,
    db,
    queues: infrastructure.queues(),
    telemetry,
  });
  return { handler, telemetry, close: async () => {} };
}

export const handler = lambdaEntry(() => composeSweeper(deployedInfrastructure()));
