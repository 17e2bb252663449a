/**
 * Moves a queue's dead letters back to it. On AWS, SQS's own message move task does it
 * (StartMessageMoveTask, with the source queue named explicitly: our consumers dead-letter by
 * SendMessage, so SQS does not know the letters' origin). Endpoints without that API (fauxqs
 * answers `InvalidAction`) get the same effect by hand: receive → send to the source → delete.
 */
import { randomUUID } from 'node:crypto';
import { ListMessageMoveTasksCommand, StartMessageMoveTaskCommand } from '@aws-sdk/client-sqs';
import {
  deadLetterQueueName,
  QUEUE_DEFINITIONS,
  type QueueName,
  type Queues,
} from '../../functions/adapters/queues.ts';
import {
  callSqs,
  deleteMessage,
  queueArn,
  queueDepth,
  receive,
  returnMessage,
  toDeadLetter,
} from './dead-letters.ts';

export const RedriveMethod = {
  MESSAGE_MOVE_TASK: 'message-move-task',
  RESEND: 'resend',
} as const;
export type RedriveMethod = (typeof RedriveMethod)[keyof typeof RedriveMethod];

export interface RedriveResult {
  queue: QueueName;
  deadLetterQueue: string;
  method: RedriveMethod;
  /** Messages moved (for a move task: as SQS reports it when we stopped watching). */
  moved: number;
  /** Dead letters seen but left in place because they came back from this very redrive. */
  skipped: number;
  /** Move task only: its handle and last status (RUNNING when it outlived our wait). */
  taskHandle: string | null;
  taskStatus: string | null;
}

/** Error names of endpoints that do not implement message move tasks. */
const MOVE_TASK_UNSUPPORTED = new Set([
  'InvalidAction',
  'UnsupportedOperation',
  'AWS.SimpleQueueService.UnsupportedOperation',
  'UnknownOperationException',
  'NotImplemented',
]);

/** Long enough to send and delete a batch; a crash meanwhile just makes the letters visible again. */
const RESEND_VISIBILITY_SECONDS = 60;
const TASK_POLL_INTERVAL_MS = 1_000;

export async function redriveDeadLetters(
  queues: Queues,
  queue: QueueName,
  options: { waitForTaskMs: number },
): Promise<RedriveResult> {
  const deadLetterQueue = deadLetterQueueName(queue);
  const [sourceArn, destinationArn] = await Promise.all([
    queueArn(queues, deadLetterQueue),
    queueArn(queues, queue),
  ]);
  let taskHandle: string | undefined;
  try {
    const started = await queues.client.send(
      new StartMessageMoveTaskCommand({ SourceArn: sourceArn, DestinationArn: destinationArn }),
    );
    taskHandle = started.TaskHandle;
  } catch (error) {
    const { name, $metadata } = error as { name?: string; $metadata?: { httpStatusCode?: number } };
    if (!MOVE_TASK_UNSUPPORTED.has(name ?? '') && $metadata?.httpStatusCode !== 501) {
      return callSqs(deadLetterQueue, 'StartMessageMoveTask', () => Promise.reject(error));
    }
  }
  if (taskHandle !== undefined) return watchMoveTask(queues, queue, sourceArn, taskHandle, options);
  return resend(queues, queue);
}

async function watchMoveTask(
  queues: Queues,
  queue: QueueName,
  sourceArn: string,
  taskHandle: string,
  options: { waitForTaskMs: number },
): Promise<RedriveResult> {
  const deadline = Date.now() + options.waitForTaskMs;
  const result: RedriveResult = {
    queue,
    deadLetterQueue: deadLetterQueueName(queue),
    method: RedriveMethod.MESSAGE_MOVE_TASK,
    moved: 0,
    skipped: 0,
    taskHandle,
    taskStatus: 'RUNNING',
  };
  for (;;) {
    const { Results } = await callSqs(result.deadLetterQueue, 'ListMessageMoveTasks', () =>
      queues.client.send(new ListMessageMoveTasksCommand({ SourceArn: sourceArn, MaxResults: 10 })),
    );
    const task = Results?.find((candidate) => candidate.TaskHandle === taskHandle) ?? Results?.[0];
    result.moved = Number(task?.ApproximateNumberOfMessagesMoved ?? 0);
    result.taskStatus = task?.Status ?? result.taskStatus;
    if (result.taskStatus !== 'RUNNING' || Date.now() >= deadline) return result;
    await new Promise((resolve) => setTimeout(resolve, TASK_POLL_INTERVAL_MS));
  }
}

/**
 * The by-hand move. Only as many letters as the DLQ held at the start are taken, and a letter
 * whose `sourceMessageId` is one this redrive sent is left alone: a message that fails again at
 * once is dead-lettered again while we work, and must not be sent round in a loop.
 */
async function resend(queues: Queues, queue: QueueName): Promise<RedriveResult> {
  const deadLetterQueue = deadLetterQueueName(queue);
  const fifo = QUEUE_DEFINITIONS[queue].fifo;
  // In-flight letters count: a peek (ours, or an operator's `dlq`) leaves them there for a moment.
  const depth = await queueDepth(queues, deadLetterQueue);
  const budget = depth.visible + depth.inFlight;
  const sent = new Set<string>();
  const skipped = new Set<string>();
  const result: RedriveResult = {
    queue,
    deadLetterQueue,
    method: RedriveMethod.RESEND,
    moved: 0,
    skipped: 0,
    taskHandle: null,
    taskStatus: null,
  };
  // Two rounds in a row that move nothing end it: the rest is gone or came back from us.
  let idleRounds = 0;
  while (result.moved < budget && idleRounds < 2) {
    const messages = await receive(queues, deadLetterQueue, {
      max: budget - result.moved,
      visibilityTimeoutSeconds: RESEND_VISIBILITY_SECONDS,
    });
    const movedBefore = result.moved;
    for (const message of messages) {
      const letter = toDeadLetter(message, queue);
      if (letter.sourceMessageId !== null && sent.has(letter.sourceMessageId)) {
        skipped.add(letter.messageId);
        await returnMessage(queues, deadLetterQueue, message.ReceiptHandle!);
        continue;
      }
      const messageId = await queues.send(
        queue,
        letter.body,
        fifo
          ? {
              // The group keeps the scope's ordering; a fresh deduplication id, because SQS drops
              // a send whose id it saw in the last 5 minutes (the original's may be that recent).
              groupId: message.Attributes?.MessageGroupId ?? 'redrive',
              deduplicationId: randomUUID(),
            }
          : {},
      );
      sent.add(messageId);
      // Sent before deleted: a crash in between duplicates the message, which the protocol absorbs.
      await deleteMessage(queues, deadLetterQueue, message.ReceiptHandle!);
      result.moved += 1;
    }
    idleRounds = result.moved > movedBefore ? 0 : idleRounds + 1;
  }
  result.skipped = skipped.size;
  return result;
}
