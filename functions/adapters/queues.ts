/**
 * The queues, by the contract's base names, and the few SQS calls the functions make. Queue
 * attributes come from `infra/queues.json`, the same file the deployed resources are made from.
 */
import {
  ChangeMessageVisibilityCommand,
  GetQueueUrlCommand,
  type MessageAttributeValue,
  SendMessageBatchCommand,
  SendMessageCommand,
  SQSClient,
} from '@aws-sdk/client-sqs';
import definitions from '../../infra/queues.json' with { type: 'json' };
import { type AwsTimeouts, boundedAwsClientOptions } from './aws-clients.ts';
import { QueueUnavailableError } from './errors.ts';
import { type BatchEntry, type BatchOutcome, createSendBatcher } from './send-batcher.ts';

export const QueueName = {
  RUN_FINISHED: 'run-finished',
  RUNTIME_RELEASE: 'runtime-release.fifo',
  RUNTIME_FINALIZE: 'runtime-finalize',
  RUNTIME_CLEANED: 'runtime-cleaned',
} as const;
export type QueueName = (typeof QueueName)[keyof typeof QueueName];

export interface QueueDefinition {
  fifo: boolean;
  consumer: string | null;
  visibilityTimeoutSeconds: number;
  maxReceiveCount: number | null;
  messageRetentionSeconds: number;
}

export const QUEUE_DEFINITIONS = definitions.queues as Record<QueueName, QueueDefinition>;
export const FUNCTION_DEFINITIONS = definitions.functions;

/** `<name>-dlq`, with `.fifo` kept last for FIFO queues (docs/integration.md, section 2). */
export function deadLetterQueueName(name: string): string {
  return name.endsWith('.fifo') ? `${name.slice(0, -'.fifo'.length)}-dlq.fifo` : `${name}-dlq`;
}

/** Names of every queue the stack creates: each queue, then its DLQ where it is consumed. */
export function allQueueNames(): string[] {
  return Object.entries(QUEUE_DEFINITIONS).flatMap(([name, definition]) =>
    definition.consumer ? [name, deadLetterQueueName(name)] : [name],
  );
}

export interface SendOptions {
  groupId?: string;
  deduplicationId?: string;
  delaySeconds?: number;
  attributes?: Record<string, string>;
}

export interface Queues {
  send(queue: string, body: unknown, options?: SendOptions): Promise<string>;
  changeVisibility(queue: string, receiptHandle: string, seconds: number): Promise<void>;
  url(queue: string): Promise<string>;
  /** SQS calls made so far (the benchmarks report them per cleanup). */
  readonly stats: { calls: number };
  readonly client: SQSClient;
}

export interface QueuesOptions {
  /** Deployed names carry a stage prefix; locally the base names are used. */
  prefix?: string;
  endpoint?: string;
  region?: string;
  client?: SQSClient;
}

export function createSqsClient(options: {
  endpoint?: string;
  region?: string;
  timeouts?: AwsTimeouts;
}): SQSClient {
  return new SQSClient({
    // Bounded: an endpoint that accepts and never answers fails the call, it does not hang it.
    ...boundedAwsClientOptions(options.timeouts),
    region: options.region ?? process.env.AWS_REGION ?? 'us-east-1',
    ...(options.endpoint
      ? {
          endpoint: options.endpoint,
          // Local emulators' queue URLs name hosts that do not resolve; always use the endpoint.
          useQueueUrlAsEndpoint: false,
          credentials: {
            accessKeyId: process.env.AWS_ACCESS_KEY_ID ?? 'local',
            secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY ?? 'local',
          },
        }
      : {}),
  });
}

export function createQueues(options: QueuesOptions = {}): Queues {
  const client = options.client ?? createSqsClient(options);
  const prefix = options.prefix ?? '';
  const urls = new Map<string, Promise<string>>();
  const stats = { calls: 0 };

  const call = async <T>(what: string, queue: string, operation: () => Promise<T>): Promise<T> => {
    stats.calls += 1;
    try {
      return await operation();
    } catch (error) {
      throw new QueueUnavailableError(
        `SQS ${what} on ${queue} failed: ${(error as Error).name}: ${(error as Error).message}`,
        { queue, operation: what },
        { cause: error },
      );
    }
  };

  const url = (queue: string): Promise<string> => {
    let cached = urls.get(queue);
    if (!cached) {
      cached = call('GetQueueUrl', queue, async () => {
        const result = await client.send(new GetQueueUrlCommand({ QueueName: `${prefix}${queue}` }));
        if (!result.QueueUrl) throw new Error('no QueueUrl in the answer');
        return result.QueueUrl;
      });
      // A failed lookup must not be cached: the next record tries again.
      cached.catch(() => urls.delete(queue));
      urls.set(queue, cached);
    }
    return cached;
  };

  const sendBatch = async (queue: string, entries: BatchEntry[]): Promise<BatchOutcome> => {
    const queueUrl = await url(queue);
    if (entries.length === 1) {
      const result = await call('SendMessage', queue, () =>
        client.send(new SendMessageCommand({ QueueUrl: queueUrl, ...entries[0]! })),
      );
      return { sent: new Map([[0, result.MessageId ?? '']]), failed: new Map() };
    }
    const result = await call('SendMessageBatch', queue, () =>
      client.send(
        new SendMessageBatchCommand({
          QueueUrl: queueUrl,
          Entries: entries.map((entry, index) => ({ Id: String(index), ...entry })),
        }),
      ),
    );
    const sent = new Map((result.Successful ?? []).map((entry) => [Number(entry.Id), entry.MessageId ?? '']));
    const failed = new Map(
      (result.Failed ?? []).map((entry) => [
        Number(entry.Id),
        new QueueUnavailableError(
          `SQS SendMessageBatch on ${queue} refused an entry: ${entry.Code} ${entry.Message ?? ''}`,
          {
            queue,
            operation: 'SendMessageBatch',
            code: entry.Code,
            senderFault: entry.SenderFault,
          },
        ),
      ]),
    );
    return { sent, failed };
  };
  const sendBatched = createSendBatcher(sendBatch);

  return {
    client,
    stats,
    url,
    async send(queue, body, sendOptions = {}) {
      const attributes: Record<string, MessageAttributeValue> = {};
      for (const [key, value] of Object.entries(sendOptions.attributes ?? {})) {
        attributes[key] = { DataType: 'String', StringValue: value };
      }
      return sendBatched(queue, {
        MessageBody: typeof body === 'string' ? body : JSON.stringify(body),
        ...(sendOptions.groupId ? { MessageGroupId: sendOptions.groupId } : {}),
        ...(sendOptions.deduplicationId ? { MessageDeduplicationId: sendOptions.deduplicationId } : {}),
        ...(sendOptions.delaySeconds ? { DelaySeconds: sendOptions.delaySeconds } : {}),
        ...(Object.keys(attributes).length ? { MessageAttributes: attributes } : {}),
      });
    },
    async changeVisibility(queue, receiptHandle, seconds) {
      const queueUrl = await url(queue);
      await call('ChangeMessageVisibility', queue, () =>
        client.send(
          new ChangeMessageVisibilityCommand({
            QueueUrl: queueUrl,
            ReceiptHandle: receiptHandle,
            VisibilityTimeout: Math.max(0, Math.min(43_200, Math.round(seconds))),
          }),
        ),
      );
    },
  };
}
