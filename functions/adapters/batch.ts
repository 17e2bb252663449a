/**
 * The shape every consumer shares (Powertools' prepare → process each record → build
 * `batchItemFailures`), plus the two rules that keep a cleanup from being lost or stuck:
 *
 * - A record that can never succeed (non-retryable error), or that failed on its last allowed
 *   receive, is sent to the queue's DLQ *by us*, with its reason as message attributes, and then
 *   acknowledged. SQS's own redrive would move it without a reason.
 * - A retryable failure sets the record's visibility to an exponential, jittered, capped backoff
 *   and reports the item as failed; SQS redelivers it then.
 *
 * A full-batch failure is returned as every item failed (never thrown and caught into an empty
 * response, which would make SQS delete the whole batch).
 */
import { BatchProcessor, EventType, processPartialResponse } from '@aws-lambda-powertools/batch';
import type { Logger } from '@aws-lambda-powertools/logger';
import type { Context, SQSBatchResponse, SQSEvent, SQSRecord } from 'aws-lambda';
import { backoffSeconds } from '../cleanup/backoff.ts';
import { isCleanupError } from '../cleanup/errors.ts';
import type { CleanupConfig } from './config.ts';
import { FifoGroupProcessor } from './fifo-group-processor.ts';
import { MetricName } from './metric-names.ts';
import type { Telemetry } from './observability.ts';
import { deadLetterQueueName, QUEUE_DEFINITIONS, type QueueName, type Queues } from './queues.ts';
import { redactSecrets } from './redact.ts';

export interface RecordContext {
  record: SQSRecord;
  receiveCount: number;
  logger: Logger;
  /** Remaining Lambda time at the start of the batch, in ms. */
  remainingTimeMs: () => number;
}

export interface ConsumerDependencies {
  queues: Queues;
  telemetry: Telemetry;
  config: CleanupConfig;
  /**
   * The queues' real maxReceiveCount where it differs from infra/queues.json (the local stack's
   * test overrides). The last allowed receive must be known exactly: past it SQS would move the
   * message itself, without a reason.
   */
  maxReceiveCounts?: Partial<Record<string, number>>;
}

export interface ConsumerOptions {
  queue: QueueName;
  processRecord: (context: RecordContext) => Promise<void>;
}

const MAX_REASON_LENGTH = 1000;
const UNEXPECTED = 'UNEXPECTED';

function failureFacts(error: unknown): {
  code: string;
  retryable: boolean;
  message: string;
  retryAfterSeconds?: number | undefined;
} {
  if (isCleanupError(error)) {
    return {
      code: error.code,
      retryable: error.retryable,
      message: error.message,
      retryAfterSeconds: error.retryAfterSeconds,
    };
  }
  // A bug or an error nobody classified: retry it (with backoff), it dead-letters when exhausted.
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return { code: UNEXPECTED, retryable: true, message };
}

/**
 * The visibility delay before a failed record comes back: its backoff, or the failing side's
 * Retry-After when that asks for longer — never beyond CLEANUP_RETRY_MAX_SECONDS, so a hostile or
 * mistaken Retry-After (a day, a year) cannot park a fence for longer than the cap allows.
 */
export function retryDelaySeconds(
  receiveCount: number,
  retryAfterSeconds: number | undefined,
  policy: { baseSeconds: number; maxSeconds: number },
  random?: () => number,
): number {
  const backoff = backoffSeconds(receiveCount, policy, random);
  if (retryAfterSeconds === undefined || !Number.isFinite(retryAfterSeconds)) return backoff;
  return Math.max(backoff, Math.min(Math.ceil(retryAfterSeconds), policy.maxSeconds));
}

export function createSqsConsumer(
  options: ConsumerOptions,
  deps: ConsumerDependencies,
): (event: SQSEvent, context: Context) => Promise<SQSBatchResponse> {
  const definition = QUEUE_DEFINITIONS[options.queue];
  const maxReceiveCount = deps.maxReceiveCounts?.[options.queue] ?? definition.maxReceiveCount;
  const { queues, telemetry, config } = deps;
  const policy = { baseSeconds: config.retryBaseSeconds, maxSeconds: config.retryMaxSeconds };

  const deadLetter = async (
    record: SQSRecord,
    facts: ReturnType<typeof failureFacts>,
    exhausted: boolean,
  ) => {
    const reason = redactSecrets(
      exhausted ? `retries exhausted; last error: ${facts.message}` : facts.message,
    ).slice(0, MAX_REASON_LENGTH);
    await queues.send(deadLetterQueueName(options.queue), record.body, {
      attributes: {
        reason,
        errorCode: facts.code,
        sourceQueue: options.queue,
        sourceMessageId: record.messageId,
        receiveCount: record.attributes.ApproximateReceiveCount ?? '1',
        deadLetteredAt: new Date().toISOString(),
      },
      ...(definition.fifo
        ? { groupId: record.attributes.MessageGroupId ?? 'dead-letters', deduplicationId: record.messageId }
        : {}),
    });
    telemetry.count(MetricName.DEAD_LETTERED, { queue: options.queue, reason: facts.code });
    return reason;
  };

  /**
   * `retryDelays`: per message group, the delay given to its failed record in this batch (its
   * backoff or Retry-After), which the group's skipped records then share.
   */
  const handleRecord = async (record: SQSRecord, context: Context, retryDelays: Map<string, number>) => {
    const receiveCount = Number(record.attributes.ApproximateReceiveCount ?? '1') || 1;
    const logger = telemetry.logger.createChild({
      persistentKeys: { queue: options.queue, messageId: record.messageId, receiveCount },
    });
    try {
      await options.processRecord({
        record,
        receiveCount,
        logger,
        remainingTimeMs: () => context.getRemainingTimeInMillis(),
      });
    } catch (error) {
      const facts = failureFacts(error);
      const exhausted = maxReceiveCount !== null && receiveCount >= maxReceiveCount;
      if (!facts.retryable || exhausted) {
        const reason = await deadLetter(record, facts, exhausted);
        logger.error('message dead-lettered', { errorCode: facts.code, reason, exhausted });
        return;
      }
      const delaySeconds = retryDelaySeconds(receiveCount, facts.retryAfterSeconds, policy);
      retryDelays.set(record.attributes.MessageGroupId ?? '', delaySeconds);
      telemetry.count(MetricName.RETRY_SCHEDULED, { queue: options.queue, errorCode: facts.code });
      logger.warn('attempt failed; will retry', {
        errorCode: facts.code,
        error: facts.message,
        retryInSeconds: delaySeconds,
        ...(facts.retryAfterSeconds !== undefined ? { retryAfterSeconds: facts.retryAfterSeconds } : {}),
        ...(facts.code === UNEXPECTED && error instanceof Error ? { stack: error.stack } : {}),
      });
      try {
        await queues.changeVisibility(options.queue, record.receiptHandle, delaySeconds);
      } catch (visibilityError) {
        logger.warn('could not set the retry delay; the queue visibility timeout applies', {
          error: (visibilityError as Error).message,
        });
      }
      throw error;
    }
  };

  return async (event, context) => {
    // One stored (undimensioned) metric per invocation, flushed by the logMetrics middleware.
    telemetry.metrics.addMetric(MetricName.RECORDS_RECEIVED, 'Count', event.Records.length);
    const retryDelays = new Map<string, number>();
    // Skipped records of a failed group come back with the failed record's delay, not after
    // the queue's long default visibility timeout.
    const processor = definition.fifo
      ? new FifoGroupProcessor((record) =>
          queues.changeVisibility(
            options.queue,
            record.receiptHandle,
            retryDelays.get(record.attributes.MessageGroupId ?? '') ?? backoffSeconds(1, policy),
          ),
        )
      : new BatchProcessor(EventType.SQS);
    return processPartialResponse(
      event,
      (record: SQSRecord) => handleRecord(record, context, retryDelays),
      processor,
      {
        context,
        throwOnFullBatchFailure: false,
      },
    );
  };
}
