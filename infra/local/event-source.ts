/**
 * Lambda's SQS event source mapping, emulated: long-poll (20 s, as the mapping does) for up to the
 * function's batch size (at most 10) per ReceiveMessage, build a real `SQSEvent`, invoke the
 * handler with a Lambda-like context, and delete exactly the records the partial batch response
 * did not list as failed, with one DeleteMessageBatch. No per-record SQS call: an idle queue
 * costs one receive per poller per 20 s, a busy one one receive and one delete per batch. A handler that throws, or runs past its function timeout, has
 * nothing deleted: the whole batch comes back after the visibility timeout, as in Lambda.
 *
 * A timed-out invocation: Lambda kills it, so production never runs two invocations of one message
 * (or, FIFO, of one message group) at once. Here a handler cannot be killed, so at its function
 * timeout the invocation is ABORTED (its context's `abortSignal` fires, and
 * `getRemainingTimeInMillis` is 0) and reported through `onError`; and until it has actually
 * returned, its poller takes no other batch and its batch is kept invisible (its visibility extended
 * while it runs), so SQS hands neither the message nor its FIFO group to another invocation. Once it
 * returns, the batch's visibility is set to what is left of the timeout it was received with: it
 * comes back when it would have after a killed Lambda invocation, and nothing of it is deleted.
 *
 * `concurrency` pollers per queue stand in for Lambda's concurrent instances (for FIFO queues,
 * SQS itself keeps one message group in flight at a time).
 */
import {
  ChangeMessageVisibilityBatchCommand,
  DeleteMessageBatchCommand,
  type Message,
  type MessageAttributeValue,
  ReceiveMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { Context, SQSBatchResponse, SQSEvent, SQSMessageAttributes, SQSRecord } from 'aws-lambda';
import { AWS_REQUEST_TIMEOUT_MS } from '../../functions/adapters/aws-clients.ts';

export interface EventSourceOptions {
  client: SQSClient;
  queueUrl: string;
  queueArn: string;
  functionName: string;
  handler: (event: SQSEvent, context: Context) => Promise<SQSBatchResponse>;
  batchSize: number;
  timeoutSeconds: number;
  /** Long-poll wait of each receive, in seconds (0-20); 20 unless told. */
  waitTimeSeconds?: number;
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

/**
 * The local context: Lambda's, plus the signal that aborts the invocation at its function timeout
 * (where Lambda would kill it). Local only; a handler that reads it must not rely on it deployed.
 */
export interface LocalLambdaContext extends Context {
  readonly abortSignal: AbortSignal;
}

/** A Lambda-like context: the function's name and a deadline `timeoutSeconds` from now. */
export function localLambdaContext(
  functionName: string,
  timeoutSeconds: number,
  abortSignal: AbortSignal = new AbortController().signal,
): LocalLambdaContext {
  const deadline = Date.now() + timeoutSeconds * 1000;
  invocationSequence += 1;
  return {
    abortSignal,
    callbackWaitsForEmptyEventLoop: false,
    functionName,
    functionVersion: '$LATEST',
    invokedFunctionArn: `arn:aws:lambda:local:000000000000:function:${functionName}`,
    memoryLimitInMB: '256',
    awsRequestId: `local-${process.pid}-${invocationSequence}`,
    logGroupName: `/aws/lambda/${functionName}`,
    logStreamName: 'local',
    // An aborted invocation has no time left, whatever the clock says.
    getRemainingTimeInMillis: () => (abortSignal.aborted ? 0 : Math.max(0, deadline - Date.now())),
    done: () => {},
    fail: () => {},
    succeed: () => {},
  };
}

/** SQS's longest long poll, and what Lambda's event source mapping itself uses. */
export const LONG_POLL_SECONDS = 20;
/** After a failed receive (the emulator restarting, say), before the next one. */
const RECEIVE_ERROR_PAUSE_MS = 1_000;

export function createEventSource(options: EventSourceOptions): EventSource {
  const region = options.region ?? 'us-east-1';
  const waitTimeSeconds = options.waitTimeSeconds ?? LONG_POLL_SECONDS;
  // Received messages stay invisible for the function timeout plus a margin, not the queue's (6x
  // longer) default: a stack killed mid-batch has its messages back within a minute or three
  // instead of up to 18, while a running invocation is never redelivered under it.
  const visibilityTimeout = Math.min(
    options.queueVisibilityTimeoutSeconds ?? Number.POSITIVE_INFINITY,
    options.timeoutSeconds + 10,
  );
  let stopped = true;
  /** Resolves at stop(): a timed-out invocation that never returns is then held no longer. */
  let stopNow: () => void = () => {};
  let stopping = new Promise<void>((resolve) => {
    stopNow = resolve;
  });
  /** The receives waiting right now, one per idle poller, aborted by stop(). */
  const receiving = new Set<AbortController>();
  let loops: Promise<void>[] = [];
  const firstPolls: Promise<void>[] = [];
  const signals: (() => void)[] = [];
  for (let i = 0; i < options.concurrency; i += 1) {
    firstPolls.push(new Promise<void>((resolve) => signals.push(resolve)));
  }

  const receive = async (): Promise<Message[]> => {
    const abort = new AbortController();
    receiving.add(abort);
    try {
      const output = await options.client.send(
        new ReceiveMessageCommand({
          QueueUrl: options.queueUrl,
          MaxNumberOfMessages: Math.min(10, options.batchSize),
          WaitTimeSeconds: waitTimeSeconds,
          VisibilityTimeout: visibilityTimeout,
          MessageSystemAttributeNames: ['All'],
          MessageAttributeNames: ['All'],
        }),
        // The stack's client bounds every call at AWS_REQUEST_TIMEOUT_MS (5 s), shorter than the
        // long poll: cut short, a receive that the emulator answers after the client gave up
        // leaves its messages invisible, unprocessed, for the whole visibility timeout. So this
        // call alone waits for the poll plus the usual bound.
        { abortSignal: abort.signal, requestTimeout: waitTimeSeconds * 1_000 + AWS_REQUEST_TIMEOUT_MS },
      );
      return output.Messages ?? [];
    } finally {
      receiving.delete(abort);
    }
  };

  /** One DeleteMessageBatch per ten messages; an entry SQS refuses is reported, not thrown. */
  const acknowledge = async (messages: Message[]) => {
    for (let start = 0; start < messages.length; start += 10) {
      const chunk = messages.slice(start, start + 10);
      const output = await options.client.send(
        new DeleteMessageBatchCommand({
          QueueUrl: options.queueUrl,
          Entries: chunk.map((message, index) => ({
            Id: String(index),
            ReceiptHandle: message.ReceiptHandle!,
          })),
        }),
      );
      for (const failure of output.Failed ?? []) {
        options.onError?.(
          new Error(`DeleteMessageBatch refused an entry: ${failure.Code} ${failure.Message ?? ''}`),
        );
      }
    }
  };

  /** Sets the visibility of every message of `messages` (ChangeMessageVisibilityBatch, by ten). */
  const setVisibility = async (messages: readonly Message[], seconds: number) => {
    for (let start = 0; start < messages.length; start += 10) {
      const chunk = messages.slice(start, start + 10);
      const output = await options.client.send(
        new ChangeMessageVisibilityBatchCommand({
          QueueUrl: options.queueUrl,
          Entries: chunk.map((message, index) => ({
            Id: String(index),
            ReceiptHandle: message.ReceiptHandle!,
            VisibilityTimeout: seconds,
          })),
        }),
      );
      for (const failure of output.Failed ?? []) {
        options.onError?.(
          new Error(
            `ChangeMessageVisibilityBatch refused an entry: ${failure.Code} ${failure.Message ?? ''}`,
          ),
        );
      }
    }
  };

  /**
   * A timed-out invocation that has not returned: its batch is kept invisible (visibility extended
   * every third of the visibility timeout) until it does, or until stop(). Then the batch gets what
   * was left of the visibility it was received with, as after a killed Lambda invocation.
   */
  const holdUntilSettled = async (
    messages: readonly Message[],
    settled: Promise<unknown>,
    receivedAt: number,
  ) => {
    const extend = () =>
      setVisibility(messages, visibilityTimeout).catch((error: Error) => options.onError?.(error));
    await extend();
    const heartbeat = setInterval(extend, Math.max(1, Math.floor(visibilityTimeout / 3)) * 1000);
    try {
      await Promise.race([settled, stopping]);
    } finally {
      clearInterval(heartbeat);
    }
    const leftSeconds = Math.max(0, Math.ceil((receivedAt + visibilityTimeout * 1000 - Date.now()) / 1000));
    await setVisibility(messages, leftSeconds).catch((error: Error) => options.onError?.(error));
  };

  /** One invocation: the handler, then the deletes its partial batch response allows. */
  const invoke = async (messages: Message[], receivedAt: number): Promise<Message[]> => {
    const event: SQSEvent = { Records: messages.map((m) => toSqsRecord(m, options.queueArn, region)) };
    const abort = new AbortController();
    const context = localLambdaContext(options.functionName, options.timeoutSeconds, abort.signal);
    const invokedAt = Date.now();
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), options.timeoutSeconds * 1000);
    });
    // Settles (never rejects) when the handler has actually returned or thrown.
    const running = (async () => options.handler(event, context))();
    const settled = running.then(
      () => undefined,
      () => undefined,
    );
    try {
      const response = await Promise.race([running, timedOut]);
      if (response === 'timeout') {
        abort.abort(
          new Error(`${options.functionName}: function timed out after ${options.timeoutSeconds} s`),
        );
        options.onError?.(
          new Error(
            `${options.functionName} invocation ${context.awsRequestId} timed out after ${options.timeoutSeconds} s; ` +
              'aborted, and its batch is held invisible until it returns (Lambda would have killed it)',
          ),
        );
        options.onInvocation?.({ records: messages.length, failed: messages.length, threw: true });
        await holdUntilSettled(messages, settled, receivedAt);
        return [];
      }
      const failed = new Set((response?.batchItemFailures ?? []).map((item) => item.itemIdentifier));
      options.onInvocation?.({ records: messages.length, failed: failed.size, threw: false });
      const toDelete = messages.filter((m) => !failed.has(m.MessageId!));
      if (!options.beforeAck) return toDelete;
      return await options.beforeAck({ functionName: options.functionName, invokedAt, messages, toDelete });
    } catch (error) {
      options.onError?.(error as Error);
      options.onInvocation?.({ records: messages.length, failed: messages.length, threw: true });
      return [];
    } finally {
      clearTimeout(timer);
    }
  };

  const poll = async (signalPolling: () => void) => {
    while (!stopped) {
      let messages: Message[];
      try {
        const received = receive();
        signalPolling();
        messages = await received;
      } catch (error) {
        if (stopped) return;
        options.onError?.(error as Error);
        await new Promise((resolve) => setTimeout(resolve, RECEIVE_ERROR_PAUSE_MS));
        continue;
      }
      if (!messages.length) continue;
      // The visibility timeout runs from here: when SQS handed the batch over.
      const receivedAt = Date.now();
      // Received before a stop: handled and acknowledged, as Lambda finishes a running invocation.
      const toDelete = await invoke(messages, receivedAt);
      if (!toDelete.length) continue;
      try {
        await acknowledge(toDelete);
      } catch (error) {
        options.onError?.(error as Error);
      }
    }
  };

  return {
    polling: Promise.all(firstPolls).then(() => undefined),
    start() {
      if (!stopped) return;
      stopped = false;
      stopping = new Promise<void>((resolve) => {
        stopNow = resolve;
      });
      loops = signals.map((signal) => poll(signal));
    },
    async stop() {
      stopped = true;
      stopNow();
      // A poller waiting in a long poll would otherwise hold stop() for up to 20 s. A message the
      // emulator hands to an aborted receive stays in flight until its visibility timeout, as a
      // message received by a stopping Lambda event source mapping does.
      for (const abort of receiving) abort.abort();
      await Promise.all(loops);
    },
  };
}
