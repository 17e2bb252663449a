import { CreateQueueCommand, SendMessageBatchCommand, type SQSClient } from '@aws-sdk/client-sqs';
import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AWS_REQUEST_TIMEOUT_MS } from '../../functions/adapters/aws-clients.ts';
import { createSqsClient } from '../../functions/adapters/queues.ts';
import { createEventSource, type EventSource } from '../../infra/local/event-source.ts';
import { useSqsFixture } from '../support/fixtures.ts';
import { eventually } from '../support/stack.ts';

/**
 * The local stand-in for Lambda's SQS event source mapping, against the real emulator: batch
 * receives of up to ten with 20 s long polling, one DeleteMessageBatch per invocation, never a
 * per-record call (issue 15). Every SQS call of its own client is recorded with its input.
 */
const sqsFixture = useSqsFixture();

interface Call {
  command: string;
  input: Record<string, unknown>;
}

function recordingClient(endpoint: string): { client: SQSClient; calls: Call[] } {
  const client = createSqsClient({ endpoint });
  const calls: Call[] = [];
  client.middlewareStack.add(
    (next, context) => async (args) => {
      calls.push({ command: context.commandName ?? 'Unknown', input: args.input as Record<string, unknown> });
      return next(args);
    },
    { step: 'initialize', name: 'recordCalls' },
  );
  return { client, calls };
}

let queue = 0;
async function freshQueue(client: SQSClient): Promise<{ url: string; arn: string }> {
  queue += 1;
  const { QueueUrl } = await client.send(new CreateQueueCommand({ QueueName: `event-source-${queue}` }));
  return { url: QueueUrl!, arn: `arn:aws:sqs:us-east-1:000000000000:event-source-${queue}` };
}

async function sendMany(client: SQSClient, url: string, count: number): Promise<void> {
  for (let start = 0; start < count; start += 10) {
    const size = Math.min(10, count - start);
    await client.send(
      new SendMessageBatchCommand({
        QueueUrl: url,
        Entries: Array.from({ length: size }, (_, i) => ({ Id: String(i), MessageBody: `m-${start + i}` })),
      }),
    );
  }
}

const count = (calls: Call[], command: string) => calls.filter((call) => call.command === command).length;

describe('the local event source mapping', () => {
  let recorded: { client: SQSClient; calls: Call[] };
  let source: EventSource | undefined;
  beforeAll(() => {
    recorded = recordingClient(sqsFixture.endpoint);
  });
  afterAll(async () => {
    await source?.stop();
    recorded.client.destroy();
  });

  it('receives in batches of up to ten and deletes each batch with one DeleteMessageBatch', async () => {
    const { url, arn } = await freshQueue(sqsFixture.sqs);
    await sendMany(sqsFixture.sqs, url, 25);
    const seen: string[] = [];
    const invocations: number[] = [];
    source = createEventSource({
      client: recorded.client,
      queueUrl: url,
      queueArn: arn,
      functionName: 'counting',
      handler: async (event: SQSEvent): Promise<SQSBatchResponse> => {
        invocations.push(event.Records.length);
        seen.push(...event.Records.map((record) => record.body));
        return { batchItemFailures: [] };
      },
      batchSize: 10,
      timeoutSeconds: 30,
      concurrency: 1,
    });
    source.start();
    await eventually('all 25 handled', async () => seen.length === 25);
    await eventually(
      'every batch deleted',
      async () => count(recorded.calls, 'DeleteMessageBatchCommand') === invocations.length,
    );
    await source.stop();
    source = undefined;

    expect(new Set(seen).size).toBe(25);
    expect(Math.max(...invocations)).toBe(10);
    expect(invocations.length).toBeLessThanOrEqual(4);
    expect(count(recorded.calls, 'DeleteMessageCommand')).toBe(0);
    const receives = recorded.calls.filter((call) => call.command === 'ReceiveMessageCommand');
    for (const receive of receives) {
      expect(receive.input).toMatchObject({ MaxNumberOfMessages: 10, WaitTimeSeconds: 20 });
    }
    // One receive per batch, plus at most the one long poll each poller had open when stopped.
    expect(receives.length).toBeLessThanOrEqual(invocations.length + 1);
  });

  it('keeps a long poll open past the client per-call bound, so a late message is neither lost nor delayed', async () => {
    // The stack's SQS client bounds every call at AWS_REQUEST_TIMEOUT_MS, shorter than the 20 s
    // poll. A receive cut short at that bound fails, and a message the emulator hands to the
    // abandoned poll stays invisible for the whole visibility timeout (seen as 25-30 s stalls).
    const { url, arn } = await freshQueue(sqsFixture.sqs);
    const before = recorded.calls.length;
    const errors: Error[] = [];
    const handledAt: number[] = [];
    source = createEventSource({
      client: recorded.client,
      queueUrl: url,
      queueArn: arn,
      functionName: 'late-message',
      handler: async (): Promise<SQSBatchResponse> => {
        handledAt.push(Date.now());
        return { batchItemFailures: [] };
      },
      batchSize: 10,
      timeoutSeconds: 30,
      concurrency: 1,
      onError: (error) => errors.push(error),
    });
    source.start();
    await new Promise((resolve) => setTimeout(resolve, AWS_REQUEST_TIMEOUT_MS + 1_500));
    const sentAt = Date.now();
    await sendMany(sqsFixture.sqs, url, 1);
    await eventually('the late message handled', async () => handledAt.length === 1);
    await source.stop();
    source = undefined;

    expect(errors.map((error) => error.message)).toEqual([]);
    // The poll that was open when the message arrived took it; the other is the one open at stop.
    expect(count(recorded.calls.slice(before), 'ReceiveMessageCommand')).toBeLessThanOrEqual(2);
    expect(handledAt[0]! - sentAt).toBeLessThan(AWS_REQUEST_TIMEOUT_MS);
  });

  it('deletes only what the partial batch response did not list as failed', async () => {
    const { url, arn } = await freshQueue(sqsFixture.sqs);
    await sendMany(sqsFixture.sqs, url, 4);
    const before = recorded.calls.length;
    let handled = 0;
    source = createEventSource({
      client: recorded.client,
      queueUrl: url,
      queueArn: arn,
      functionName: 'half-failing',
      handler: async (event: SQSEvent): Promise<SQSBatchResponse> => {
        handled += event.Records.length;
        return {
          batchItemFailures: event.Records.filter(
            (record) => record.body.endsWith('1') || record.body.endsWith('3'),
          ).map((record) => ({ itemIdentifier: record.messageId })),
        };
      },
      batchSize: 10,
      // The failed ones come back after the visibility timeout: 1 s + 10 s margin is beyond this test.
      timeoutSeconds: 1,
      concurrency: 1,
    });
    source.start();
    await eventually('the four handled', async () => handled >= 4);
    await eventually('the batch acknowledged', async () =>
      recorded.calls.slice(before).some((call) => call.command === 'DeleteMessageBatchCommand'),
    );
    await source.stop();
    source = undefined;
    const deletes = recorded.calls
      .slice(before)
      .filter((call) => call.command === 'DeleteMessageBatchCommand');
    expect(deletes).toHaveLength(1);
    expect((deletes[0]!.input.Entries as unknown[]).length).toBe(2);
  });

  it('stops at once while its pollers wait in a 20 s long poll', async () => {
    const { url, arn } = await freshQueue(sqsFixture.sqs);
    source = createEventSource({
      client: recorded.client,
      queueUrl: url,
      queueArn: arn,
      functionName: 'idle',
      handler: async () => ({ batchItemFailures: [] }),
      batchSize: 10,
      timeoutSeconds: 30,
      concurrency: 4,
    });
    source.start();
    await source.polling;
    // Without aborting the open long polls, stop() would wait for them (up to 20 s): the test's
    // own timeout (10 s) would fail it.
    await source.stop();
    source = undefined;
  });
});
