/**
 * Lambda's SQS event source mapping, emulated with `sqs-consumer`: poll, build a real `SQSEvent`,
 * invoke the handler with a Lambda-like context, and delete exactly the records the partial batch
 * response did not list as failed. A handler that throws, or runs past its function timeout, has
 * nothing deleted: the whole batch comes back after the visibility timeout, as in Lambda.
 *
 * `concurrency` pollers per queue stand in for Lambda's concurrent instances (for FIFO queues,
 * SQS itself keeps one message group in flight at a time).
 */
import type { Message, MessageAttributeValue, SQSClient } from '@aws-sdk/client-sqs';
import type { Context, SQSBatchResponse, SQSEvent, SQSMessageAttributes, SQSRecord } from 'aws-lambda';
import { Consumer } from 'sqs-consumer';

export interface EventSourceOptions {
  client: SQSClient;
  queueUrl: string;
  queueArn: string;
  functionName: string;
  handler: (event: SQSEvent, context: Context) => Promise<SQSBatchResponse>;
  batchSize: number;
  timeoutSeconds: number;
  /** The queue's own visibility timeout; receives never ask for longer. */
  queueVisibilityTimeoutSeconds?: number;
  concurrency: number;
  region?: string;
  onError?: (error: Error) => void;
  /** Called after each invocation, for progress displays and tests. */
  onInvocation?: (summary: { records: number; failed: number; threw: boolean }) => void;
  /**
   * Chaos hook (test/chaos): called once per completed invocation with the messages about to be
   * deleted; only the messages it returns are deleted. Dropping some emulates a process that
   * crashed after its handler finished but before the event source deleted them: they come back
   * after the visibility timeout, as duplicates. Omitted (the default), every one is deleted.
   */
  beforeAck?: (invocation: AckInvocation) => Message[] | Promise<Message[]>;
}

/** What `beforeAck` learns about one invocation. */
export interface AckInvocation {
  functionName: string;
  /** Epoch milliseconds when the handler was invoked. */
  invokedAt: number;
  /** Every message of the batch, failed ones included. */
  messages: readonly Message[];
  /** The messages the partial batch response reported as processed. */
  toDelete: Message[];
}

export interface EventSource {
  start(): void;
  stop(): Promise<void>;
  /** Resolves once every poller has sent its first receive (the stack logs `stack ready` then). */
  polling: Promise<void>;
}

let invocationSequence = 0;

function toRecordAttributes(message: Message): SQSRecord['attributes'] {
  const system = message.Attributes ?? {};
  return {
    ApproximateReceiveCount: system.ApproximateReceiveCount ?? '1',
    SentTimestamp: system.SentTimestamp ?? String(Date.now()),
    SenderId: system.SenderId ?? 'local',
    ApproximateFirstReceiveTimestamp: system.ApproximateFirstReceiveTimestamp ?? String(Date.now()),
    ...(system.MessageGroupId ? { MessageGroupId: system.MessageGroupId } : {}),
    ...(system.MessageDeduplicationId ? { MessageDeduplicationId: system.MessageDeduplicationId } : {}),
    ...(system.SequenceNumber ? { SequenceNumber: system.SequenceNumber } : {}),
  };
}

function toMessageAttributes(
  attributes: Record<string, MessageAttributeValue> | undefined,
): SQSMessageAttributes {
  const result: SQSMessageAttributes = {};
  for (const [key, value] of Object.entries(attributes ?? {})) {
    result[key] = {
      dataType: value.DataType ?? 'String',
      ...(value.StringValue !== undefined ? { stringValue: value.StringValue } : {}),
    };
  }
  return result;
}

export function toSqsRecord(message: Message, queueArn: string, region: string): SQSRecord {
  return {
    messageId: message.MessageId!,
    receiptHandle: message.ReceiptHandle!,
    body: message.Body ?? '',
    attributes: toRecordAttributes(message),
    messageAttributes: toMessageAttributes(message.MessageAttributes),
    md5OfBody: message.MD5OfBody ?? '',
    eventSource: 'aws:sqs',
    eventSourceARN: queueArn,
    awsRegion: region,
  };
}

/** A Lambda-like context: the function's name and a deadline `timeoutSeconds` from now. */
export function localLambdaContext(functionName: string, timeoutSeconds: number): Context {
  const deadline = Date.now() + timeoutSeconds * 1000;
  invocationSequence += 1;
  return {
    callbackWaitsForEmptyEventLoop: false,
    functionName,
    functionVersion: '$LATEST',
    invokedFunctionArn: `arn:aws:lambda:local:000000000000:function:${functionName}`,
    memoryLimitInMB: '256',
    awsRequestId: `local-${process.pid}-${invocationSequence}`,
    logGroupName: `/aws/lambda/${functionName}`,
    logStreamName: 'local',
    getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
    done: () => {},
    fail: () => {},
    succeed: () => {},
  };
}

export function createEventSource(options: EventSourceOptions): EventSource {
  const region = options.region ?? 'us-east-1';
  const firstPolls: Promise<void>[] = [];
  const consumers = Array.from({ length: options.concurrency }, () => {
    let signalPolling: () => void = () => {};
    firstPolls.push(new Promise<void>((resolve) => (signalPolling = resolve)));
    const consumer = Consumer.create({
      queueUrl: options.queueUrl,
      sqs: options.client,
      useQueueUrlAsEndpoint: false,
      batchSize: options.batchSize,
      // Received messages stay invisible for the function timeout plus a margin, not the queue's
      // (6x longer) default: a stack killed mid-batch has its messages back within a minute or
      // three instead of up to 18, while a running invocation is never redelivered under it.
      visibilityTimeout: Math.min(
        options.queueVisibilityTimeoutSeconds ?? Number.POSITIVE_INFINITY,
        options.timeoutSeconds + 10,
      ),
      waitTimeSeconds: 1,
      pollingWaitTimeMs: 0,
      pollingCompleteWaitTimeMs: 5_000,
      attributeNames: ['All'],
      messageSystemAttributeNames: ['All'],
      messageAttributeNames: ['All'],
      suppressFifoWarning: true,
      preReceiveMessageCallback: async () => signalPolling(),
      handleMessageBatch: async (messages) => {
        const event: SQSEvent = { Records: messages.map((m) => toSqsRecord(m, options.queueArn, region)) };
        const context = localLambdaContext(options.functionName, options.timeoutSeconds);
        const invokedAt = Date.now();
        let timer: NodeJS.Timeout | undefined;
        const timedOut = new Promise<'timeout'>((resolve) => {
          timer = setTimeout(() => resolve('timeout'), options.timeoutSeconds * 1000);
        });
        try {
          const response = await Promise.race([options.handler(event, context), timedOut]);
          if (response === 'timeout') {
            options.onInvocation?.({ records: messages.length, failed: messages.length, threw: true });
            return [];
          }
          const failed = new Set((response?.batchItemFailures ?? []).map((item) => item.itemIdentifier));
          options.onInvocation?.({ records: messages.length, failed: failed.size, threw: false });
          const toDelete = messages.filter((m) => !failed.has(m.MessageId!));
          if (!options.beforeAck) return toDelete;
          return await options.beforeAck({
            functionName: options.functionName,
            invokedAt,
            messages,
            toDelete,
          });
        } catch (error) {
          options.onError?.(error as Error);
          options.onInvocation?.({ records: messages.length, failed: messages.length, threw: true });
          return [];
        } finally {
          clearTimeout(timer);
        }
      },
    });
    consumer.on('error', (error) => options.onError?.(error));
    consumer.on('processing_error', (error) => options.onError?.(error));
    return consumer;
  });
  return {
    polling: Promise.all(firstPolls).then(() => undefined),
    start() {
      for (const consumer of consumers) consumer.start();
    },
    async stop() {
      await Promise.all(
        consumers.map(
          (consumer) =>
            new Promise<void>((resolve) => {
              if (!consumer.status.isRunning) return resolve();
              consumer.once('stopped', () => resolve());
              consumer.stop({ abort: false });
            }),
        ),
      );
    },
  };
}
