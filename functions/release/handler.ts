import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { type ConsumerDependencies, createSqsConsumer } from '../adapters/batch.ts';
import type { CleanupConfig } from '../adapters/config.ts';
import type { Database } from '../adapters/database.ts';
import { MAX_RESTARTS, nextRestart } from '../adapters/deferral.ts';
import { deployedInfrastructure } from '../adapters/deployed-infrastructure.ts';
import type { ComposedFunction, Infrastructure } from '../adapters/infrastructure.ts';
import { lambdaEntry, type SqsHandler } from '../adapters/lambda.ts';
import { parseMessage, ReleaseCommand } from '../adapters/messages.ts';
import { MetricName } from '../adapters/metric-names.ts';
import { openProvisionerClient } from '../adapters/open-provisioner.ts';
import { ProvisionerClient } from '../adapters/provisioner-client.ts';
import { announceRunFinished, publishFinalize } from '../adapters/publish.ts';
import { QueueName } from '../adapters/queues.ts';
import { CleanupError, ErrorCode, IdentityUnstableError, ReleaseRefusedError } from '../cleanup/errors.ts';
import { release } from '../cleanup/release.ts';
import {
  beginRelease,
  DELETE_IN_FLIGHT_MARGIN_SECONDS,
  type DeleteInFlight,
  deleteInFlightSeconds,
  deleteSettledBy,
  endRelease,
  ReleaseGuard,
} from '../cleanup/release-guard.ts';
import { deleteMayStillAct, SandboxProvider } from '../cleanup/sandbox-provider.ts';
import type { ReleaseResult } from '../cleanup/types.ts';

/**
 * Time kept back from the Lambda deadline for publishing the finalize command and reporting the
 * batch: without it a release that uses all its time would succeed and then be killed before
 * anyone heard of it (harmless, but it would be redone).
 */
export const PUBLISH_MARGIN_MS = 5_000;

/**
 * release: `runtime-release.fifo` → release guard → phase 2 (no transaction) → `runtime-finalize`.
 * Retryable failures come back with backoff; the fence stays up throughout. A command the guard
 * refuses (forged or mismatched) is dead-lettered at once with its own code, before any DELETE.
 */
export function createReleaseHandler(
  deps: ConsumerDependencies & { provider: SandboxProvider; db: Database },
): SqsHandler {
  const { provider, queues, telemetry, config, db } = deps;
  const policy = { baseSeconds: config.retryBaseSeconds, maxSeconds: config.retryMaxSeconds };
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
        // The bound is fixed before the guard, so the in-flight record covers exactly it.
        const deadlineMs = Math.max(1_000, remainingTimeMs() - PUBLISH_MARGIN_MS);
        const boundMs = Math.min(config.runtimeCleanupTimeoutSeconds * 1000, deadlineMs);
        let guard: Awaited<ReturnType<typeof beginRelease>>;
        try {
          guard = await beginRelease(db, command, {
            inFlightSeconds: deleteInFlightSeconds(boundMs, config.provisionerDeleteTimeoutSeconds),
            lockTimeoutMs: config.databaseLockTimeoutMs,
          });
        } catch (error) {
          if (error instanceof ReleaseRefusedError) {
            logger.error('release refused before any DELETE', {
              errorCode: error.code,
              sandboxId: command.sandboxId,
            });
            // The command is parked; the fence it names is not. Phase 1 resolves the run's cleanup
            // again from the database (a platform that recorded a new sandbox while the fence was
            // up gets it cleaned without waiting for the sweeper).
            if (error.code === ErrorCode.RELEASE_SANDBOX_MISMATCH) {
              const next = nextRestart(command.restarts, policy);
              if (next) {
                await announceRunFinished(queues, command.runId, {
                  reason: 'sandbox_mismatch_at_release',
                  ...next,
                });
              } else {
                logger.error(
                  'not restarting at phase 1: the chain restarted too often; left to the sweeper',
                  {
                    restarts: command.restarts,
                  },
                );
              }
            }
          }
          throw error;
        }
        if (guard.verdict === ReleaseGuard.FENCE_GONE) {
          telemetry.count(MetricName.RELEASE_SKIPPED, { reason: guard.verdict });
          logger.info('release skipped: the fence it was for is gone', { sandboxId: command.sandboxId });
          return;
        }
        if (guard.verdict === ReleaseGuard.SCOPE_ACTIVE || guard.verdict === ReleaseGuard.ALREADY_RELEASED) {
          // Restart at phase 1: it defers while the scope is busy, and finds nothing to delete once
          // the generation is gone.
          // Counted and delayed like every restart (deferral.ts), and dead-lettered past the bound.
          telemetry.count(MetricName.RELEASE_SKIPPED, { reason: guard.verdict });
          const next = nextRestart(command.restarts, policy);
          if (!next) {
            throw new IdentityUnstableError(
              `the release guard answered ${guard.verdict} after ${MAX_RESTARTS} restarts at phase 1; fence kept, left to the sweeper`,
              { verdict: guard.verdict, restarts: command.restarts ?? 0 },
            );
          }
          await announceRunFinished(queues, command.runId, {
            reason: `${guard.verdict}_at_release`,
            ...next,
          });
          logger.warn('release skipped; fence check again', {
            reason: guard.verdict,
            restarts: next.restarts,
            restartInSeconds: next.delaySeconds,
            ...(guard.verdict === ReleaseGuard.SCOPE_ACTIVE ? { activeRunId: guard.activeRunId } : {}),
          });
          return;
        }
        const { inFlight } = guard;
        /** How long a request we stopped waiting for may still act at the provisioner. */
        const residualSeconds = config.provisionerDeleteTimeoutSeconds + DELETE_IN_FLIGHT_MARGIN_SECONDS;
        const started = performance.now();
        let result: ReleaseResult;
        try {
          result = await release(command, { provider, runtimeCleanupTimeoutMs: boundMs });
        } catch (error) {
          countFailure(error);
          // Ended without an answer: the provisioner may still carry the request out for its own
          // delete time, so the scope stays quarantined that long (never longer than the record).
          // A request that went unanswered before this failure (reset after it may have been
          // written), or a 202, may still be acting, whatever the failure's status says.
          await settle(
            inFlight,
            deleteSettledBy(error) && !deleteMayStillAct(error) ? undefined : residualSeconds,
          );
          throw error;
        }
        // Answered: nothing of this attempt can act any more, unless one of its requests went
        // unanswered before the answer came (a reset after the request may have been written):
        // the provisioner may still be carrying that one out, so the residual window stays. Lowered
        // before finalize is published, so the scope opens as soon as its fence clears.
        await settle(inFlight, result.unansweredAttempts ? residualSeconds : undefined);
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

        function countFailure(error: unknown): void {
          const errorCode = error instanceof CleanupError ? error.code : 'UNEXPECTED';
          telemetry.count(MetricName.RELEASE_FAILED, { errorCode });
        }

        /** Lowers the in-flight record; a failure only leaves it to expire at its deadline. */
        async function settle(record: DeleteInFlight, residualSeconds?: number): Promise<void> {
          try {
            const until = await endRelease(db, record, residualSeconds);
            if (until) {
              logger.info('scope stays quarantined: a delete may still act at the provisioner', {
                deleteInFlightUntil: until.toISOString(),
              });
            }
          } catch (error) {
            logger.warn('could not lower the delete-in-flight record; it ends at its deadline', {
              deleteInFlightUntil: record.until.toISOString(),
              error: (error as Error).message,
            });
          }
        }
      },
    },
    deps,
  );
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
