import type { Logger } from '@aws-lambda-powertools/logger';
import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { type ConsumerDependencies, createSqsConsumer } from '../adapters/batch.ts';
import type { CleanupConfig } from '../adapters/config.ts';
import type { Database } from '../adapters/database.ts';
import { deployedInfrastructure } from '../adapters/deployed-infrastructure.ts';
import type { ComposedFunction, Infrastructure } from '../adapters/infrastructure.ts';
import { lambdaEntry, type SqsHandler } from '../adapters/lambda.ts';
import { parseMessage, ReleaseCommand } from '../adapters/messages.ts';
import { MetricName } from '../adapters/metric-names.ts';
import { openProvisionerClient } from '../adapters/open-provisioner.ts';
import { ProvisionerClient } from '../adapters/provisioner-client.ts';
import { announceRunFinished, publishFinalize } from '../adapters/publish.ts';
import { QueueName } from '../adapters/queues.ts';
import { CleanupError, ErrorCode } from '../cleanup/errors.ts';
import { processReleaseCommand, type QuarantineFacts } from '../cleanup/release-command.ts';
import { SandboxProvider } from '../cleanup/sandbox-provider.ts';

/**
 * Time kept back from the Lambda deadline for publishing the finalize command and reporting the
 * batch: without it a release that uses all its time would succeed and then be killed before
 * anyone heard of it (harmless, but it would be redone).
 */
export const PUBLISH_MARGIN_MS = 5_000;

/**
 * release: `runtime-release.fifo` → phase 2 (functions/cleanup/release-command.ts: the release
 * guard, the bounded DELETE with no transaction open, the delete-in-flight record settled) →
 * `runtime-finalize`. This handler only wires it: parse, decide, publish, log and count.
 * Retryable failures come back with backoff; the fence stays up throughout. A command the guard
 * refuses (forged or mismatched) is dead-lettered at once with its own code, before any DELETE.
 */
export function createReleaseHandler(
  deps: ConsumerDependencies & { provider: SandboxProvider; db: Database },
): SqsHandler {
  const { provider, queues, telemetry, config, db } = deps;
  const retryPolicy = { baseSeconds: config.retryBaseSeconds, maxSeconds: config.retryMaxSeconds };
  return createSqsConsumer(
    {
      queue: QueueName.RUNTIME_RELEASE,
      async processRecord({ record, logger, remainingTimeMs }) {
        const command = parseMessage(ReleaseCommand, record.body);
        logger.appendKeys({
          runId: command.runId,
          uid: command.uid,
          runtimeScopeId: command.runtimeScopeId,
          generation: command.generation,
          phase: 'release',
        });
        const started = performance.now();
        // The bound is fixed before the guard, so the in-flight record covers exactly it.
        const deadlineMs = Math.max(1_000, remainingTimeMs() - PUBLISH_MARGIN_MS);
        const decision = await processReleaseCommand(command, {
          db,
          provider,
          boundMs: Math.min(config.runtimeCleanupTimeoutSeconds * 1000, deadlineMs),
          provisionerDeleteTimeoutSeconds: config.provisionerDeleteTimeoutSeconds,
          databaseLockTimeoutMs: config.databaseLockTimeoutMs,
          retryPolicy,
        });
        switch (decision.action) {
          case 'refused':
            logger.error('release refused before any DELETE', {
              errorCode: decision.error.code,
              sandboxId: command.sandboxId,
            });
            if (decision.restart) {
              await announceRunFinished(queues, command.runId, {
                reason: 'sandbox_mismatch_at_release',
                ...decision.restart,
              });
            } else if (decision.error.code === ErrorCode.RELEASE_SANDBOX_MISMATCH) {
              logger.error('not restarting at phase 1: the chain restarted too often; left to the sweeper', {
                restarts: command.restarts,
              });
            }
            throw decision.error;
          case 'skip':
            telemetry.count(MetricName.RELEASE_SKIPPED, { reason: decision.verdict });
            logger.info('release skipped: the fence it was for is gone', { sandboxId: command.sandboxId });
            return;
          case 'restart':
            telemetry.count(MetricName.RELEASE_SKIPPED, { reason: decision.verdict });
            await announceRunFinished(queues, command.runId, {
              reason: `${decision.verdict}_at_release`,
              restarts: decision.restarts,
              delaySeconds: decision.delaySeconds,
            });
            logger.warn('release skipped; fence check again', {
              reason: decision.verdict,
              restarts: decision.restarts,
              restartInSeconds: decision.delaySeconds,
              ...(decision.activeRunId ? { activeRunId: decision.activeRunId } : {}),
            });
            return;
          case 'failed':
            logQuarantine(logger, decision);
            countFailure(decision.error);
            throw decision.error;
          case 'finalize': {
            logQuarantine(logger, decision);
            const { result } = decision;
            try {
              telemetry.count(MetricName.RELEASE_SUCCEEDED, { outcome: result.outcome });
              telemetry.milliseconds(MetricName.RELEASE_DURATION, performance.now() - started);
              telemetry.milliseconds(MetricName.RELEASE_LOCK_WAIT, result.lockWaitMs);
              await publishFinalize(
                queues,
                command,
                result.outcome,
                command.restarts ? { restarts: command.restarts } : {},
              );
              logger.info('sandbox released', {
                sandboxId: command.sandboxId,
                outcome: result.outcome,
                lockWaitMs: Math.round(result.lockWaitMs),
                deleteMs: Math.round(result.deleteMs),
                ...(result.unansweredAttempts ? { unansweredAttempts: result.unansweredAttempts } : {}),
              });
            } catch (error) {
              countFailure(error);
              throw error;
            }
            return;
          }
        }
      },
    },
    deps,
  );

  function countFailure(error: unknown): void {
    const errorCode = error instanceof CleanupError ? error.code : 'UNEXPECTED';
    telemetry.count(MetricName.RELEASE_FAILED, { errorCode });
  }
}

/** What became of the attempt's delete-in-flight record, when it is worth a line. */
function logQuarantine(logger: Logger, facts: QuarantineFacts): void {
  if (facts.quarantinedUntil) {
    logger.info('scope stays quarantined: a delete may still act at the provisioner', {
      deleteInFlightUntil: facts.quarantinedUntil.toISOString(),
    });
  }
  if (facts.settleError !== undefined) {
    logger.warn('could not lower the delete-in-flight record; it ends at its deadline', {
      deleteInFlightUntil: facts.recordUntil?.toISOString(),
      error: facts.settleError instanceof Error ? facts.settleError.message : String(facts.settleError),
    });
  }
}

/** The provider over a real HTTP client to the provisioner (or its URL), with the configured bounds. */
export function createProvider(
  config: CleanupConfig,
  provisioner: string | ProvisionerClient,
): SandboxProvider {
  return new SandboxProvider({
    client: typeof provisioner === 'string' ? new ProvisionerClient(provisioner) : provisioner,
    releaseLockTimeoutMs: config.releaseLockTimeoutSeconds * 1000,
    provisionerDeleteTimeoutMs: config.provisionerDeleteTimeoutSeconds * 1000,
  });
}

/**
 * The composition root: release is the only function that calls the provisioner, so the only one
 * that needs (and validates) SANDBOX_PROVISIONER_URL; it also reads the database for its guard.
 */
export async function composeRelease(
  infrastructure: Infrastructure,
): Promise<ComposedFunction<SQSEvent, SQSBatchResponse>> {
  const { config, maxReceiveCounts } = infrastructure;
  const telemetry = infrastructure.telemetry('release');
  // SANDBOX_PROVISIONER_URL validated and the token read (deployed: from SSM) before anything else.
  const provider = createProvider(config, await openProvisionerClient(infrastructure, telemetry));
  const db = await infrastructure.database('release', telemetry);
  const handler = createReleaseHandler({
    config,
    db,
    provider,
    queues: infrastructure.queues(),
    telemetry,
    ...(maxReceiveCounts ? { maxReceiveCounts } : {}),
  });
  return { handler, telemetry, close: () => provider.close() };
}

export const handler = lambdaEntry(() => composeRelease(deployedInfrastructure()));
