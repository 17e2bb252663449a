/**
 * Creates the contract's queues on any SQS-compatible endpoint (fauxqs, LocalStack, a real
 * account) from `infra/queues.json`, the same definitions the deployed resources are made from.
 * Idempotent: CreateQueue with the same attributes returns the existing queue.
 */
import { CreateQueueCommand, GetQueueAttributesCommand, type SQSClient } from '@aws-sdk/client-sqs';
import {
  deadLetterQueueName,
  QUEUE_DEFINITIONS,
  type QueueDefinition,
} from '../../functions/adapters/queues.ts';

export interface QueueOverrides {
  /** Shorter visibility timeouts make crash-recovery tests take seconds instead of minutes. */
  visibilityTimeoutSeconds?: Partial<Record<string, number>>;
  maxReceiveCount?: Partial<Record<string, number>>;
}

export interface CreatedQueue {
  name: string;
  url: string;
  arn: string;
  definition: QueueDefinition & { visibilityTimeoutSeconds: number; maxReceiveCount: number | null };
}

export async function createQueues(
  client: SQSClient,
  options: { prefix?: string; overrides?: QueueOverrides } = {},
): Promise<Map<string, CreatedQueue>> {
  const prefix = options.prefix ?? '';
  const created = new Map<string, CreatedQueue>();
  const create = async (name: string, attributes: Record<string, string>) => {
    const { QueueUrl } = await client.send(
      new CreateQueueCommand({ QueueName: `${prefix}${name}`, Attributes: attributes }),
    );
    const { Attributes } = await client.send(
      new GetQueueAttributesCommand({ QueueUrl: QueueUrl!, AttributeNames: ['QueueArn'] }),
    );
    return { url: QueueUrl!, arn: Attributes!.QueueArn! };
  };
  for (const [name, base] of Object.entries(QUEUE_DEFINITIONS)) {
    const definition = {
      ...base,
      visibilityTimeoutSeconds:
        options.overrides?.visibilityTimeoutSeconds?.[name] ?? base.visibilityTimeoutSeconds,
      maxReceiveCount: options.overrides?.maxReceiveCount?.[name] ?? base.maxReceiveCount,
    };
    const fifo: Record<string, string> = definition.fifo ? { FifoQueue: 'true' } : {};
    const attributes: Record<string, string> = {
      ...fifo,
      VisibilityTimeout: String(definition.visibilityTimeoutSeconds),
      MessageRetentionPeriod: String(definition.messageRetentionSeconds),
    };
    if (definition.consumer && definition.maxReceiveCount !== null) {
      const dlqName = deadLetterQueueName(name);
      const dlq = await create(dlqName, { ...fifo, MessageRetentionPeriod: '1209600' });
      created.set(dlqName, {
        name: dlqName,
        ...dlq,
        definition: { ...definition, consumer: null, maxReceiveCount: null },
      });
      attributes.RedrivePolicy = JSON.stringify({
        deadLetterTargetArn: dlq.arn,
        maxReceiveCount: definition.maxReceiveCount,
      });
    }
    created.set(name, { name, ...(await create(name, attributes)), definition });
  }
  return created;
}
