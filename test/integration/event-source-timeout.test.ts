/**
 * A local invocation past its function timeout, against the real SQS emulator. Lambda kills a
 * timed-out invocation, so production never runs two invocations of one message (or, FIFO, of one
 * message group) at once; the local event source cannot kill a handler, so it aborts it (the
 * context's abortSignal) and holds its batch invisible until it has actually returned. The chaos
 * suite and the e2e tests run on this stand-in: a violation it let happen would be the emulation's.
 */
import { CreateQueueCommand, SendMessageCommand } from '@aws-sdk/client-sqs';
import type { Context, SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { afterEach, describe, expect, it } from 'vitest';
import {
  createEventSource,
  type EventSource,
  type EventSourceOptions,
  type LocalLambdaContext,
} from '../../infra/local/event-source.ts';
import { useSqsFixture } from '../support/fixtures.ts';
import { eventually } from '../support/stack.ts';

const sqsFixture = useSqsFixture();
let source: EventSource | undefined;
afterEach(async () => {
  await source?.stop();
  source = undefined;
});

/** The queue's own visibility timeout: a timed-out invocation's batch would be visible again after it. */
const VISIBILITY_SECONDS = 3;
/** How long a stuck handler goes on past its 1 s function timeout: well past the visibility timeout. */
const STUCK_MS = 2 * VISIBILITY_SECONDS * 1000;

let queues = 0;
async function freshQueue(fifo: boolean): Promise<{ url: string; arn: string }> {
  queues += 1;
  const name = `timeout-${queues}${fifo ? '.fifo' : ''}`;
  const { QueueUrl } = await sqsFixture.sqs.send(
    new CreateQueueCommand({
      QueueName: name,
      Attributes: {
        VisibilityTimeout: String(VISIBILITY_SECONDS),
        ...(fifo ? { FifoQueue: 'true', ContentBasedDeduplication: 'true' } : {}),
      },
    }),
  );
  return { url: QueueUrl!, arn: `arn:aws:sqs:us-east-1:000000000000:${name}` };
}

/** Counts what runs at once, by message body; the first invocation of `stuckBody` overstays. */
function watchedHandler(stuckBody: string) {
  const watch = {
    running: 0,
    maxRunning: 0,
    handled: [] as string[],
    abortedWhileRunning: false,
    remainingAtAbort: -1,
  };
  let stuck = true;
  const handler = async (event: SQSEvent, context: Context): Promise<SQSBatchResponse> => {
    const body = event.Records.map((record) => record.body).join(',');
    watch.running += 1;
    watch.maxRunning = Math.max(watch.maxRunning, watch.running);
    try {
      if (body === stuckBody && stuck) {
        stuck = false;
        // A DELETE hung past the function timeout whose own bound failed to fire, in a handler
        // that does not listen to the abort: the worst case, which Lambda ends by killing it.
        await new Promise((resolve) => setTimeout(resolve, STUCK_MS));
        const { abortSignal } = context as LocalLambdaContext;
        watch.abortedWhileRunning = abortSignal.aborted;
        watch.remainingAtAbort = context.getRemainingTimeInMillis();
      }
      watch.handled.push(body);
      return { batchItemFailures: [] };
    } finally {
      watch.running -= 1;
    }
  };
  return { watch, handler };
}

function startSource(
  queue: { url: string; arn: string },
  handler: EventSourceOptions['handler'],
  errors: string[],
) {
  source = createEventSource({
    client: sqsFixture.sqs,
    queueUrl: queue.url,
    queueArn: queue.arn,
    functionName: 'stuck',
    batchSize: 1,
    timeoutSeconds: 1,
    waitTimeSeconds: 1,
    queueVisibilityTimeoutSeconds: VISIBILITY_SECONDS,
    concurrency: 2,
    handler,
    onError: (error) => errors.push(error.message),
  });
  source.start();
}

describe('an invocation past its function timeout', () => {
  it('is aborted, and its message is not handed to another invocation until it has returned', async () => {
    const queue = await freshQueue(false);
    await sqsFixture.sqs.send(new SendMessageCommand({ QueueUrl: queue.url, MessageBody: 'm' }));
    const { watch, handler } = watchedHandler('m');
    const errors: string[] = [];
    startSource(queue, handler, errors);

    // The message comes back (nothing of a timed-out invocation is deleted) and is handled again.
    await eventually('the message handled twice', async () => watch.handled.length >= 2, 30_000);

    expect(watch.maxRunning, 'two invocations of one message at once').toBe(1);
    expect(watch.abortedWhileRunning).toBe(true);
    expect(watch.remainingAtAbort).toBe(0);
    expect(errors.some((message) => message.includes('timed out after 1 s'))).toBe(true);
  }, 40_000);

  it('a handler that listens to the abort stops at the timeout, and nothing of its batch is deleted', async () => {
    const queue = await freshQueue(false);
    await sqsFixture.sqs.send(new SendMessageCommand({ QueueUrl: queue.url, MessageBody: 'a' }));
    const reasons: string[] = [];
    let calls = 0;
    const errors: string[] = [];
    startSource(
      queue,
      async (_event, context) => {
        calls += 1;
        if (calls > 1) return { batchItemFailures: [] };
        const { abortSignal } = context as LocalLambdaContext;
        await new Promise<void>((resolve) => abortSignal.addEventListener('abort', () => resolve()));
        reasons.push(String((abortSignal.reason as Error).message));
        return { batchItemFailures: [] };
      },
      errors,
    );

    await eventually('redelivered after the abort', async () => calls >= 2, 30_000);

    expect(reasons).toEqual(['stuck: function timed out after 1 s']);
  }, 40_000);

  it('on a FIFO queue, the message group is not handed to another invocation while it runs', async () => {
    const queue = await freshQueue(true);
    for (const body of ['first', 'second']) {
      await sqsFixture.sqs.send(
        new SendMessageCommand({ QueueUrl: queue.url, MessageBody: body, MessageGroupId: 'scope-1' }),
      );
    }
    const { watch, handler } = watchedHandler('first');
    startSource(queue, handler, []);

    await eventually('both messages handled', async () => watch.handled.includes('second'), 30_000);

    expect(watch.maxRunning, 'two invocations of one message group at once').toBe(1);
    // In order: the stuck invocation's own end, the group's first message again (it timed out, so
    // nothing of it was deleted), and only then the second.
    expect(watch.handled).toEqual(['first', 'first', 'second']);
  }, 40_000);
});
