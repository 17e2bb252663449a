/**
 * Reading dead-letter queues without taking anything from them, and the few raw SQS calls the
 * CLI needs beyond what the functions' `Queues` offers. Dead letters carry their reason as message
 * attributes (set by functions/adapters/batch.ts): `reason`, `errorCode`, `sourceQueue`,
 * `sourceMessageId`, `receiveCount`, `deadLetteredAt`.
 */
import {
  ChangeMessageVisibilityBatchCommand,
  ChangeMessageVisibilityCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  type Message,
  ReceiveMessageCommand,
} from '@aws-sdk/client-sqs';
import { QueueUnavailableError } from '../../functions/adapters/errors.ts';
import {
  deadLetterQueueName,
  QUEUE_DEFINITIONS,
  type QueueName,
  type Queues,
} from '../../functions/adapters/queues.ts';
import { UsageError } from './errors.ts';

/** The queues that have a consumer, hence a dead-letter queue: the valid arguments of `redrive`. */
export const CONSUMED_QUEUES: readonly QueueName[] = (
  Object.entries(QUEUE_DEFINITIONS) as Array<[QueueName, (typeof QUEUE_DEFINITIONS)[QueueName]]>
)
  .filter(([, definition]) => definition.consumer !== null && definition.maxReceiveCount !== null)
  .map(([name]) => name);

/** A consumed queue by its base name (its DLQ's name is accepted too); anything else is bad usage. */
export function resolveConsumedQueue(name: string): QueueName {
  const queue = CONSUMED_QUEUES.find((q) => q === name || deadLetterQueueName(q) === name);
  if (!queue) {
    throw new UsageError(
      `unknown queue ${JSON.stringify(name)}; valid queues: ${CONSUMED_QUEUES.join(', ')}`,
    );
  }
  return queue;
}

/** One raw SQS call, failing like the functions' own calls do: QueueUnavailableError (exit code 3). */
export async function callSqs<T>(queue: string, operation: string, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    if (error instanceof QueueUnavailableError) throw error;
    throw new QueueUnavailableError(
      `SQS ${operation} on ${queue} failed: ${(error as Error).name}: ${(error as Error).message}`,
      { queue, operation },
      { cause: error },
    );
  }
}

export interface QueueDepth {
  /** ApproximateNumberOfMessages: available to receive. */
  visible: number;
  /** ApproximateNumberOfMessagesNotVisible: received and not yet deleted or returned. */
  inFlight: number;
}

export async function queueDepth(queues: Queues, queue: string): Promise<QueueDepth> {
  const url = await queues.url(queue);
  const { Attributes } = await callSqs(queue, 'GetQueueAttributes', () =>
    queues.client.send(
      new GetQueueAttributesCommand({
        QueueUrl: url,
        AttributeNames: ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible'],
      }),
    ),
  );
  return {
    visible: Number(Attributes?.ApproximateNumberOfMessages ?? 0),
    inFlight: Number(Attributes?.ApproximateNumberOfMessagesNotVisible ?? 0),
  };
}

export async function queueArn(queues: Queues, queue: string): Promise<string> {
  const url = await queues.url(queue);
  const { Attributes } = await callSqs(queue, 'GetQueueAttributes', () =>
    queues.client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['QueueArn'] })),
  );
  if (!Attributes?.QueueArn) throw new QueueUnavailableError(`SQS did not report the ARN of ${queue}`);
  return Attributes.QueueArn;
}

export async function receive(
  queues: Queues,
  queue: string,
  options: { max: number; visibilityTimeoutSeconds: number },
): Promise<Message[]> {
  const url = await queues.url(queue);
  const { Messages } = await callSqs(queue, 'ReceiveMessage', () =>
    queues.client.send(
      new ReceiveMessageCommand({
        QueueUrl: url,
        MaxNumberOfMessages: Math.min(10, Math.max(1, options.max)),
        WaitTimeSeconds: 0,
        VisibilityTimeout: options.visibilityTimeoutSeconds,
        MessageAttributeNames: ['All'],
        MessageSystemAttributeNames: ['All'],
      }),
    ),
  );
  return Messages ?? [];
}

export async function deleteMessage(queues: Queues, queue: string, receiptHandle: string): Promise<void> {
  const url = await queues.url(queue);
  await callSqs(queue, 'DeleteMessage', () =>
    queues.client.send(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: receiptHandle })),
  );
}

/** Makes a received message available again at once (a message we looked at but leave where it is). */
export async function returnMessage(queues: Queues, queue: string, receiptHandle: string): Promise<void> {
  const url = await queues.url(queue);
  await callSqs(queue, 'ChangeMessageVisibility', () =>
    queues.client.send(
      new ChangeMessageVisibilityCommand({
        QueueUrl: url,
        ReceiptHandle: receiptHandle,
        VisibilityTimeout: 0,
      }),
    ),
  );
}

export interface DeadLetter {
  deadLetterQueue: string;
  /** The consumed queue it came from (the `sourceQueue` attribute, else the DLQ's own source). */
  sourceQueue: string;
  messageId: string;
  /** `runId` of a JSON body, when there is one. */
  runId: string | null;
  errorCode: string | null;
  reason: string | null;
  receiveCount: number | null;
  deadLetteredAt: string | null;
  /** The id the message had on its source queue. */
  sourceMessageId: string | null;
  body: string;
}

export function toDeadLetter(message: Message, sourceQueue: QueueName): DeadLetter {
  const attribute = (name: string) => message.MessageAttributes?.[name]?.StringValue ?? null;
  const receiveCount = Number(attribute('receiveCount'));
  return {
    deadLetterQueue: deadLetterQueueName(sourceQueue),
    sourceQueue: attribute('sourceQueue') ?? sourceQueue,
    messageId: message.MessageId ?? '',
    runId: runIdOf(message.Body ?? ''),
    errorCode: attribute('errorCode'),
    reason: attribute('reason'),
    receiveCount: Number.isFinite(receiveCount) && receiveCount > 0 ? receiveCount : null,
    deadLetteredAt: attribute('deadLetteredAt'),
    sourceMessageId: attribute('sourceMessageId'),
    body: message.Body ?? '',
  };
}

function runIdOf(body: string): string | null {
  try {
    const parsed: unknown = JSON.parse(body);
    const runId = (parsed as { runId?: unknown } | null)?.runId;
    return typeof runId === 'string' ? runId : null;
  } catch {
    return null;
  }
}

/**
 * Bounds of a peek. Each letter is held hidden for PEEK_HOLD_SECONDS while the listing goes on
 * (so the next receive brings the next ones) and made visible again at the end, or by itself
 * after that long if this process dies first.
 */
const PEEK_HOLD_SECONDS = 30;
const PEEK_MAX_ROUNDS = 100;
const PEEK_MAX_MESSAGES = 500;
/** On AWS a short poll samples some of the queue's servers: an empty answer is asked again. */
const PEEK_EMPTY_ROUNDS = 2;

export interface Peek {
  letters: DeadLetter[];
  /** False when the listing may lack letters; `incompleteBecause` says why. */
  complete: boolean;
  /** What the DLQ reported before the peek: visible + in flight (approximate, from SQS). */
  expected: number;
  incompleteBecause: string | null;
}

/**
 * Every letter of a DLQ, without taking any: each receive hides what it returns for a short while
 * so that the next receive returns the next letters (a receive with VisibilityTimeout 0 returns the
 * same ones again), until the queue has
 * nothing more to give; then every letter is made visible again, in one batch per ten. Nothing
 * consumes DLQs but `redrive`.
 *
 * What a receive cannot show is said: letters hidden by someone else at that moment (another
 * peek, a redrive in progress), the letters of a FIFO group behind its first (SQS hands them out
 * only once the ones before are deleted, which a peek must not do), or a cap reached. `complete`
 * is false then, and `incompleteBecause` says which and how many were seen of how many counted.
 */
export async function peekDeadLetters(queues: Queues, sourceQueue: QueueName): Promise<Peek> {
  const dlq = deadLetterQueueName(sourceQueue);
  const depth = await queueDepth(queues, dlq);
  const expected = depth.visible + depth.inFlight;
  const seen = new Map<string, DeadLetter>();
  const held: string[] = [];
  let capped = false;
  try {
    let empty = 0;
    for (let round = 0; ; round += 1) {
      if (round >= PEEK_MAX_ROUNDS || seen.size >= PEEK_MAX_MESSAGES) {
        capped = true;
        break;
      }
      const messages = await receive(queues, dlq, { max: 10, visibilityTimeoutSeconds: PEEK_HOLD_SECONDS });
      for (const message of messages) {
        if (message.ReceiptHandle) held.push(message.ReceiptHandle);
        if (message.MessageId && !seen.has(message.MessageId)) {
          seen.set(message.MessageId, toDeadLetter(message, sourceQueue));
        }
      }
      empty = messages.length === 0 ? empty + 1 : 0;
      if (empty >= PEEK_EMPTY_ROUNDS) break;
    }
  } finally {
    await returnMessages(queues, dlq, held);
  }
  const letters = [...seen.values()];
  const incompleteBecause = capped
    ? `the peek stopped at ${letters.length} letters`
    : letters.length < expected
      ? `${letters.length} of about ${expected} letters seen: ${unseenBecause(dlq, depth.inFlight)}; \`npm run ops -- redrive\` moves them all`
      : null;
  return { letters, complete: incompleteBecause === null, expected, incompleteBecause };
}

/** Why a peek could not see every letter the queue counts. */
function unseenBecause(dlq: string, inFlightBefore: number): string {
  const reasons: string[] = [];
  if (inFlightBefore > 0)
    reasons.push(`${inFlightBefore} were hidden by someone else (a peek or a redrive in progress)`);
  if (dlq.endsWith('.fifo')) {
    // SQS hands out a FIFO group's next letter only once the ones before it are deleted: a listing
    // that must not delete sees the first of each group (AWS: the first few, up to ten).
    reasons.push(
      'the rest wait behind the first letter of their FIFO message group, which SQS shows only once it is deleted',
    );
  }
  if (!reasons.length) reasons.push('SQS did not hand the rest out (try again)');
  return reasons.join('; ');
}

/** Makes held messages visible again at once, ten per call; a failure leaves them to their timeout. */
async function returnMessages(
  queues: Queues,
  queue: string,
  receiptHandles: readonly string[],
): Promise<void> {
  if (!receiptHandles.length) return;
  const url = await queues.url(queue);
  for (let at = 0; at < receiptHandles.length; at += 10) {
    const entries = receiptHandles.slice(at, at + 10).map((handle, index) => ({
      Id: String(index),
      ReceiptHandle: handle,
      VisibilityTimeout: 0,
    }));
    await callSqs(queue, 'ChangeMessageVisibilityBatch', () =>
      queues.client.send(new ChangeMessageVisibilityBatchCommand({ QueueUrl: url, Entries: entries })),
    ).catch(() => {
      // They come back by themselves after PEEK_HOLD_SECONDS.
    });
  }
}

export interface ReasonCount {
  errorCode: string | null;
  reason: string | null;
  count: number;
}

/** Dead letters grouped by (errorCode, reason), most frequent first. */
/**
 * A letter without our reason attributes was moved by SQS's own redrive. When its message id is
 * the source of a letter that does carry a reason, it is the second copy of one failure: the
 * function dead-lettered the message on its last receive and then died before deleting it.
 */
export const SQS_REDRIVE_DUPLICATE = 'SQS_REDRIVE_DUPLICATE';
export const SQS_REDRIVE = 'SQS_REDRIVE';

function explainReasonless(
  letter: DeadLetter,
  reasoned: ReadonlySet<string>,
): Pick<DeadLetter, 'errorCode' | 'reason'> {
  if (letter.reason !== null || letter.errorCode !== null) return letter;
  return reasoned.has(letter.messageId)
    ? {
        errorCode: SQS_REDRIVE_DUPLICATE,
        reason:
          'a second copy of a letter above: the function dead-lettered it, then stopped before deleting it',
      }
    : {
        errorCode: SQS_REDRIVE,
        reason:
          'moved by SQS after maxReceiveCount receives without an answer (crashes or timeouts); no reason recorded',
      };
}

export function groupReasons(letters: readonly DeadLetter[]): ReasonCount[] {
  const groups = new Map<string, ReasonCount>();
  const reasoned = new Set(
    letters.flatMap((letter) =>
      letter.reason !== null && letter.sourceMessageId ? [letter.sourceMessageId] : [],
    ),
  );
  for (const original of letters) {
    const letter = explainReasonless(original, reasoned);
    const key = JSON.stringify([letter.errorCode, letter.reason]);
    const group = groups.get(key) ?? { errorCode: letter.errorCode, reason: letter.reason, count: 0 };
    group.count += 1;
    groups.set(key, group);
  }
  return [...groups.values()].sort((a, b) => b.count - a.count);
}
