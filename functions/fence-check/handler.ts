import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { type ConsumerDependencies, createSqsConsumer } from '../adapters/batch.ts';
import type { Database } from '../adapters/database.ts';
import { deployedInfrastructure } from '../adapters/deployed-infrastructure.ts';
import type { ComposedFunction, Infrastructure } from '../adapters/infrastructure.ts';
import { lambdaEntry, type SqsHandler } from '../adapters/lambda.ts';
import { parseMessage, RunFinishedMessage } from '../adapters/messages.ts';
import { MetricName } from '../adapters/metric-names.ts';
import { announceRunFinished, publishFinalize, publishRelease } from '../adapters/publish.ts';
import { QueueName } from '../adapters/queues.ts';
import { DEFERRALS, nextDeferral, RESTARTS, trustedCount } from '../cleanup/chain-limits.ts';
import { fenceCheck } from '../cleanup/fence-check.ts';
import { FenceCheckOutcome } from '../cleanup/types.ts';

/**
 * fence-check: `run-finished` → phase 1 → `runtime-release.fifo` (a sandbox to delete),
 * `runtime-finalize` (nothing to delete), a delayed re-check (deferred), or done.
 */
export function createFenceCheckHandler(deps: ConsumerDependencies & { db: Database }): SqsHandler {
  const { db, queues, telemetry, config } = deps;
  const policy = { baseSeconds: config.retryBaseSeconds, maxSeconds: config.retryMaxSeconds };
  return createSqsConsumer(
    {
      queue: QueueName.RUN_FINISHED,
      async processRecord({ record, receiveCount, logger }) {
        const message = parseMessage(RunFinishedMessage, record.body);
        logger.appendKeys({ runId: message.runId, phase: 'fence-check' });
        // The chain's restarts so far travel on to release and finalize, which count the next one.
        const restarts = trustedCount(
          RESTARTS,
          message.restarts,
          record.messageAttributes?.[RESTARTS.attribute]?.stringValue,
        );
        const result = await fenceCheck(db, message.runId);
        telemetry.count(MetricName.FENCE_CHECK_OUTCOME, { outcome: result.outcome });

        switch (result.outcome) {
          case FenceCheckOutcome.RELEASE_NEEDED: {
            const { identity } = result;
            logger.appendKeys({
              uid: identity.uid,
              runtimeScopeId: identity.runtimeScopeId,
              generation: identity.generation,
            });
            await publishRelease(
              queues,
              { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
              { messageId: record.messageId, sentTimestamp: record.attributes.SentTimestamp, receiveCount },
              restarts ? { restarts } : {},
            );
            logger.info('fence checked; release requested', { sandboxId: identity.sandboxId });
            return;
          }
          case FenceCheckOutcome.NOTHING_TO_DELETE:
            logger.appendKeys({ uid: result.identity.uid, runtimeScopeId: result.identity.runtimeScopeId });
            await publishFinalize(queues, result.identity, 'nothing_to_delete', restarts ? { restarts } : {});
            logger.info('fence checked; no live sandbox, finalizing');
            return;
          case FenceCheckOutcome.DEFERRED: {
            // The body's count only counts on the cleanup's own re-sends (chain-limits.ts).
            const previous = trustedCount(
              DEFERRALS,
              message.deferrals,
              record.messageAttributes?.[DEFERRALS.attribute]?.stringValue,
            );
            const next = nextDeferral(previous, policy);
            if (next) {
              await announceRunFinished(queues, message.runId, {
                ...next,
                ...(restarts ? { restarts } : {}),
              });
              logger.info('fence check deferred; scope still active', {
                reason: result.reason,
                blockingRunId: result.blockingRunId,
                deferrals: next.deferrals,
                recheckInSeconds: next.delaySeconds,
              });
            } else {
              logger.warn('fence check deferred too often; left to the sweeper', {
                reason: result.reason,
                blockingRunId: result.blockingRunId,
              });
            }
            return;
          }
          case FenceCheckOutcome.ALREADY_CLEAN:
          case FenceCheckOutcome.NOT_OWNER:
            logger.info('nothing to clean up', { outcome: result.outcome });
            return;
        }
      },
    },
    deps,
  );
}

/** The composition root: fence-check needs the database and the queues, nothing else. */
export async function composeFenceCheck(
  infrastructure: Infrastructure,
): Promise<ComposedFunction<SQSEvent, SQSBatchResponse>> {
  const { config, maxReceiveCounts } = infrastructure;
  const telemetry = infrastructure.telemetry('fenceCheck');
  const db = await infrastructure.database('fenceCheck', telemetry);
  const handler = createFenceCheckHandler({
    config,
    db,
    queues: infrastructure.queues(),
    telemetry,
    ...(maxReceiveCounts ? { maxReceiveCounts } : {}),
  });
  return { handler, telemetry, close: async () => {} };
}

export const handler = lambdaEntry(() => composeFenceCheck(deployedInfrastructure()));
