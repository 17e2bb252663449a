import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { type ConsumerDependencies, createSqsConsumer } from '../adapters/batch.ts';
import type { Database } from '../adapters/database.ts';
import { deployedInfrastructure } from '../adapters/deployed-infrastructure.ts';
import type { ComposedFunction, Infrastructure } from '../adapters/infrastructure.ts';
import { lambdaEntry, type SqsHandler } from '../adapters/lambda.ts';
import { FinalizeCommand, parseMessage } from '../adapters/messages.ts';
import { MetricName } from '../adapters/metric-names.ts';
import {
  announceRunFinished,
  postgresTimestampMs,
  publishCleaned,
  publishFinalize,
} from '../adapters/publish.ts';
import { QueueName } from '../adapters/queues.ts';
import { MAX_RESTARTS, nextDeferral, nextRestart } from '../cleanup/chain-limits.ts';
import { IdentityUnstableError } from '../cleanup/errors.ts';
import { finalize } from '../cleanup/finalize.ts';
import { FinalizeOutcome } from '../cleanup/types.ts';

/**
 * finalize: `runtime-finalize` → phase 3 → `runtime-cleaned` (cleared, or found clear: published
 * at least once), `run-finished` again (identity changed: restart at phase 1), or a delayed
 * re-check (deferred).
 */
export function createFinalizeHandler(deps: ConsumerDependencies & { db: Database }): SqsHandler {
  const { db, queues, telemetry, config } = deps;
  const policy = { baseSeconds: config.retryBaseSeconds, maxSeconds: config.retryMaxSeconds };
  return createSqsConsumer(
    {
      queue: QueueName.RUNTIME_FINALIZE,
      async processRecord({ record, logger }) {
        const command = parseMessage(FinalizeCommand, record.body);
        logger.appendKeys({
          runId: command.runId,
          uid: command.uid,
          runtimeScopeId: command.runtimeScopeId,
          generation: command.generation,
          phase: 'finalize',
        });
        const result = await finalize(db, command);
        telemetry.count(MetricName.FINALIZE_OUTCOME, { outcome: result.outcome });

        switch (result.outcome) {
          case FinalizeOutcome.CLEARED:
          case FinalizeOutcome.ALREADY_CLEAR: {
            const cleanedAt =
              result.outcome === FinalizeOutcome.CLEARED ? result.cleanedAt : new Date().toISOString();
            // Published after the commit, so a crash in between re-runs finalize, which finds the
            // fence clear and publishes again: at least once.
            await publishCleaned(queues, {
              runId: command.runId,
              uid: command.uid,
              runtimeScopeId: command.runtimeScopeId,
              generation: command.generation,
              cleanedAt,
            });
            if (result.outcome === FinalizeOutcome.CLEARED && command.fenceSetAt) {
              const latencyMs = Date.parse(cleanedAt) - postgresTimestampMs(command.fenceSetAt);
              if (Number.isFinite(latencyMs)) telemetry.milliseconds(MetricName.CLEANUP_LATENCY, latencyMs);
              logger.info('fence cleared', {
                cleanupLatencyMs: latencyMs,
                releaseOutcome: command.releaseOutcome,
              });
            } else {
              logger.info('fence already clear', { outcome: result.outcome });
            }
            return;
          }
          case FinalizeOutcome.IDENTITY_CHANGED: {
            // A restart is counted and delayed (chain-limits.ts): a cause that persists must not turn
            // into one DELETE per lap, without end.
            const next = nextRestart(command.restarts, policy);
            if (!next) {
              throw new IdentityUnstableError(
                `the identity changed again (${result.changed.join(', ')}) after ${MAX_RESTARTS} restarts at phase 1; fence kept, left to the sweeper`,
                { changed: result.changed, restarts: command.restarts ?? 0 },
              );
            }
            await announceRunFinished(queues, command.runId, { reason: 'identity_changed', ...next });
            logger.warn('identity changed since the fence check; fence kept, restarting at phase 1', {
              changed: result.changed,
              restarts: next.restarts,
              restartInSeconds: next.delaySeconds,
            });
            return;
          }
          case FinalizeOutcome.DEFERRED: {
            const next = nextDeferral(command.deferrals, policy);
            if (next) {
              await publishFinalize(queues, command, command.releaseOutcome, {
                ...next,
                releasedAt: command.releasedAt,
                ...(command.restarts ? { restarts: command.restarts } : {}),
              });
            }
            logger.info(
              next
                ? 'finalize deferred; scope still active'
                : 'finalize deferred too often; left to the sweeper',
              {
                reason: result.reason,
                blockingRunId: result.blockingRunId,
                ...(next ?? {}),
              },
            );
            return;
          }
        }
      },
    },
    deps,
  );
}

/** The composition root: finalize needs the database and the queues, nothing else. */
export async function composeFinalize(
  infrastructure: Infrastructure,
): Promise<ComposedFunction<SQSEvent, SQSBatchResponse>> {
  const { config, maxReceiveCounts } = infrastructure;
  const telemetry = infrastructure.telemetry('finalize');
  const db = await infrastructure.database('finalize', telemetry);
  const handler = createFinalizeHandler({
    config,
    db,
    queues: infrastructure.queues(),
    telemetry,
    ...(maxReceiveCounts ? { maxReceiveCounts } : {}),
  });
  return { handler, telemetry, close: async () => {} };
}

export const handler = lambdaEntry(() => composeFinalize(deployedInfrastructure()));
