'use strict';

/**
 * The contract's queues (docs/integration.md, section 2) and a DLQ for each consumed one, from `infra/queues.json`: the
 * same definitions the local stack creates (infra/local/queue-setup.ts), with the stage prefix.
 */
const { projectFacts } = require('./project.cjs');
const { deadLetterQueueLogicalId, queueLogicalId } = require('./names.cjs');

/** The SQS maximum: an operator has two weeks to look at a dead letter before it is gone. */
const DEAD_LETTER_RETENTION_SECONDS = 1_209_600;

/** A queue's ARN built from its name, so a DLQ can name its source without a reference cycle. */
function queueArn(physicalName) {
  return { 'Fn::Sub': `arn:\${AWS::Partition}:sqs:\${AWS::Region}:\${AWS::AccountId}:${physicalName}` };
}

function fifoAttributes(fifo) {
  // Deduplication ids are chosen by the sender (one per delivery, see publish.ts): content-based
  // deduplication would drop a legitimate retry whose body repeats within 5 minutes.
  //
  // High-throughput FIFO (docs/capacity.md): without it a FIFO queue allows 300 API calls per
  // second per action (send, receive, delete), which the release queue nears at about 1 M cleanups
  // an hour; with it the quota is per message group (one scope here, a handful of messages an
  // hour) and the queue's own limit is tens of thousands per second. It costs nothing. Scoping
  // deduplication to the message group changes nothing for us: a deduplication id names one
  // delivery of one command, and every repeat of that send carries the same group.
  return fifo
    ? {
        FifoQueue: true,
        ContentBasedDeduplication: false,
        DeduplicationScope: 'messageGroup',
        FifoThroughputLimit: 'perMessageGroupId',
      }
    : {};
}

/**
 * @param {{ prefix: string }} options the stage prefix of every physical queue name
 * @returns {{ resources: Record<string, object>, outputs: Record<string, object> }}
 */
function queueResources({ prefix }) {
  const { QUEUE_DEFINITIONS, deadLetterQueueName } = projectFacts();
  const resources = {};
  const outputs = {};
  for (const [name, definition] of Object.entries(QUEUE_DEFINITIONS)) {
    const logicalId = queueLogicalId(name);
    const properties = {
      QueueName: `${prefix}${name}`,
      ...fifoAttributes(definition.fifo),
      VisibilityTimeout: definition.visibilityTimeoutSeconds,
      MessageRetentionPeriod: definition.messageRetentionSeconds,
      // SQS-managed keys: encrypted at rest with no KMS key policy for producers to get wrong.
      SqsManagedSseEnabled: true,
    };
    if (definition.consumer) {
      const dlqName = deadLetterQueueName(name);
      const dlqLogicalId = deadLetterQueueLogicalId(name);
      properties.RedrivePolicy = {
        deadLetterTargetArn: { 'Fn::GetAtt': [dlqLogicalId, 'Arn'] },
        maxReceiveCount: definition.maxReceiveCount,
      };
      resources[dlqLogicalId] = {
        Type: 'AWS::SQS::Queue',
        // A dead letter is a cleanup that still owes a sandbox delete, with its reason: a stack
        // delete, or an update that replaces the queue, must not take them with it. A retained DLQ
        // stays in the account under its name after the stack is gone (docs/operating.md, "After a
        // stack delete").
        DeletionPolicy: 'Retain',
        UpdateReplacePolicy: 'Retain',
        Properties: {
          QueueName: `${prefix}${dlqName}`,
          ...fifoAttributes(definition.fifo),
          MessageRetentionPeriod: DEAD_LETTER_RETENTION_SECONDS,
          SqsManagedSseEnabled: true,
          // Only its own source queue may redrive into it.
          RedriveAllowPolicy: {
            redrivePermission: 'byQueue',
            sourceQueueArns: [queueArn(`${prefix}${name}`)],
          },
        },
      };
      outputs[`${dlqLogicalId}Url`] = {
        Description: `Dead letters of ${name}, each with its reason in message attributes`,
        Value: { Ref: dlqLogicalId },
      };
    }
    resources[logicalId] = { Type: 'AWS::SQS::Queue', Properties: properties };
    outputs[`${logicalId}Url`] = { Description: `The ${name} queue`, Value: { Ref: logicalId } };
    outputs[`${logicalId}Arn`] = {
      Description: `The ${name} queue (for the IAM policies of producers and subscribers)`,
      Value: { 'Fn::GetAtt': [logicalId, 'Arn'] },
    };
  }
  return { resources, outputs };
}

/** Base names of the dead-letter queues, with the base name of the queue each one serves. */
function deadLetterQueues() {
  const { QUEUE_DEFINITIONS, deadLetterQueueName } = projectFacts();
  return Object.entries(QUEUE_DEFINITIONS)
    .filter(([, definition]) => definition.consumer)
    .map(([name]) => ({ source: name, name: deadLetterQueueName(name) }));
}

module.exports = { queueResources, deadLetterQueues };
