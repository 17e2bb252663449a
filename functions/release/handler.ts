import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { type ConsumerDependencies, createSqsConsumer } from '../adapters/batch.ts';
import { type CleanupConfig, requireProvisionerUrl } from '../adapters/config.ts';
import type { Database } from '../adapters/database.ts';
import { deployedInfrastructure } from '../adapters/deployed-infrastructure.ts';
import type { ComposedFunction, Infrastructure } from '../adapters/infrastructure.ts';
import { lambdaEntry, type SqsHandler } from '../adapters/lambda.ts';
import { parseMessage, ReleaseCommand } from '../adapters/messages.ts';
import { MetricName } from '../adapters/metric-names.ts';
import { ProvisionerClient } from '../adapters/provisioner-client.ts';
import { announceRunFinished, publishFinalize } from '../adapters/publish.ts';
import { QueueName } from '../adapters/queues.ts';
import { CleanupError } from '../cleanup/errors.ts';
import { release } from '../cleanup/release.ts';
import { checkReleaseStillWanted, ReleaseGuard } from '../cleanup/release-guard.ts';
import { SandboxProvider } from '../cleanup/sandbox-provider.ts';

/**
 * Time kept back from the Lambda deadline for publishing the finalize command and reporting the
 * batch: without it a release that uses all its time would succeed and then be killed before
 * anyone heard of it (harmless, but it would be redone).
 */
export const PUBLISH_MARGIN_MS = 5_000;

/**
 * release: `runtime-release.fifo` → phase 2 (no transaction) → `runtime-finalize`.
 * Retryable failures come back with backoff; the fence stays up throughout.
 */
export function createReleaseHandler(
  deps: ConsumerDependencies & { provider: SandboxProvider; db: Database },
): SqsHandler {
  const { provider, queues, telemetry, config, db } = deps;
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
        const guard = await checkReleaseStillWanted(db, command);
        if (guard.verdict === ReleaseGuard.FENCE_GONE) {
          telemetry.count(MetricName.RELEASE_SKIPPED, { reason: guard.verdict });
          logger.info('release skipped: the fence it was for is gone', { sandboxId: command.sandboxId });
          return;
        }
        if (guard.verdict === ReleaseGuard.SCOPE_ACTIVE) {
          // Restart at phase 1, which defers with backoff until the scope is quiet again.
          telemetry.count(MetricName.RELEASE_SKIPPED, { reason: guard.verdict });
          await announceRunFinished(queues, command.runId, { reason: 'scope_active_at_release' });
          logger.warn('release skipped: a run is active in the scope; fence check again', {
            activeRunId: guard.activeRunId,
          });
          return;
        }
        const deadlineMs = Math.max(1_000, remainingTimeMs() - PUBLISH_MARGIN_MS);
        const started = performance.now();
        try {
          const result = await release(command, {
            provider,
            runtimeCleanupTimeoutMs: Math.min(config.runtimeCleanupTimeoutSeconds * 1000, deadlineMs),
          });
          telemetry.count(MetricName.RELEASE_SUCCEEDED, { outcome: result.outcome });
          telemetry.milliseconds(MetricName.RELEASE_DURATION, performance.now() - started);
          telemetry.milliseconds(MetricName.RELEASE_LOCK_WAIT, result.lockWaitMs);
          await publishFinalize(queues, command, result.outcome);
          logger.info('sandbox released', {
            sandboxId: command.sandboxId,
            outcome: result.outcome,
            lockWaitMs: Math.round(result.lockWaitMs),
            deleteMs: Math.round(result.deleteMs),
          });
        } catch (error) {
          const errorCode = error instanceof CleanupError ? error.code : 'UNEXPECTED';
          telemetry.count(MetricName.RELEASE_FAILED, { errorCode });
          throw error;
        }
      },
    },
    deps,
  );
}

/** The provider over a real HTTP client to the provisioner, with the configured bounds. */
export function createProvider(config: CleanupConfig, provisionerUrl: string): SandboxProvider {
  return new SandboxProvider({
    client: new ProvisionerClient(provisionerUrl),
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
  const provisionerUrl = requireProvisionerUrl(config);
  const telemetry = infrastructure.telemetry('release');
  const db = await infrastructure.database('release', telemetry);
  const provider = createProvider(config, provisionerUrl);
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
