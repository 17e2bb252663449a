/**
 * The FLOOR (issue 15): the unavoidable work of one cleanup with no logic, measured in the same run
 * on the same parts as the project, so the project's figures can be given as multiples of it.
 *
 * Three hops through the same SQS emulator, each one send, one receive and one delete (standard
 * queues `floor-1` → `floor-2` → `floor-3`, then `floor-done`, which the benchmark consumes as it
 * consumes runtime-cleaned); two transactions of one round trip each through the same driver and
 * bridge (`Database.transact`: the first locks the scope and the run and reads the sandbox, the
 * second locks them again, clears the fence and marks the generation released); and one HTTP
 * DELETE to the same local provisioner. The hops are driven by the same emulated event source
 * mapping as the functions (batch receives, long polling, DeleteMessageBatch), with the stack's batch
 * size and pollers per queue (a larger batch at the release hop would run more deletes at a time
 * than the deployed mapping lets the project run, and the ratio would price a setting), and with
 * handlers that do nothing else: no validation, no logging, no metrics, no retries, no dead letters, no guard.
 *
 * Each hop sends one SendMessage per cleanup (no coalescing): that is the floor's "one send".
 */
import {
  CreateQueueCommand,
  GetQueueAttributesCommand,
  SendMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { Agent, request } from 'undici';
import type { PooledDatabase } from '../../functions/adapters/database.ts';
import { createSqsClient } from '../../functions/adapters/queues.ts';
import { createEventSource, type EventSource } from '../../infra/local/event-source.ts';
import { type FloorTarget, floorCheck, floorClear } from '../support/floor-transactions.ts';
import { observeTransactions, type RoundTripTiming } from '../support/observed-transactions.ts';
import { countSqsCalls } from './sqs-call-counter.ts';

/** One one-trip transaction's round trip as the client saw it, and its lock hold on the server. */
export type LockHold = RoundTripTiming;

type Hop = { runId: string } | FloorTarget;

export interface Floor {
  /** Where the benchmark announces a finished run (`{"runId": …}`). */
  startUrl: string;
  /** Where the floor announces a cleaned run (`{"runId": …}`), as runtime-cleaned. */
  doneUrl: string;
  /** The floor's own SQS calls (its event sources' receives and deletes, its sends). */
  sqsCalls(): Record<string, number>;
  /** Lock holds (each transaction's round trip, and its time on the server), since the last call. */
  takeLockHolds(): LockHold[];
  db: PooledDatabase;
  stop(): Promise<void>;
}

export async function startFloor(options: {
  sqsEndpoint: string;
  db: PooledDatabase;
  provisionerUrl: string;
  /** Pollers per hop, as the stack's per queue. */
  concurrency: readonly [number, number, number];
  /** Records per invocation per hop, as the stack's event source mappings (`infra/queues.json`). */
  batchSizes: readonly [number, number, number];
}): Promise<Floor> {
  const sqs: SQSClient = createSqsClient({ endpoint: options.sqsEndpoint });
  const counter = countSqsCalls(sqs);
  const queue = async (name: string) => {
    const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: name }));
    const { Attributes } = await sqs.send(
      new GetQueueAttributesCommand({ QueueUrl: QueueUrl!, AttributeNames: ['QueueArn'] }),
    );
    return { url: QueueUrl!, arn: Attributes!.QueueArn! };
  };
  const [first, second, third, done] = [
    await queue('floor-1'),
    await queue('floor-2'),
    await queue('floor-3'),
    await queue('floor-done'),
  ];
  const holds: LockHold[] = [];
  const http = new Agent({ keepAliveTimeout: 30_000 });
  const { db } = options;
  const observed = observeTransactions(db, (timing) => holds.push(timing));

  const send = (url: string, body: Hop) =>
    sqs.send(new SendMessageCommand({ QueueUrl: url, MessageBody: JSON.stringify(body) }));
  const each =
    (work: (hop: Hop) => Promise<void>) =>
    async (event: SQSEvent): Promise<SQSBatchResponse> => {
      await Promise.all(event.Records.map((record) => work(JSON.parse(record.body) as Hop)));
      return { batchItemFailures: [] };
    };

  const hops: Array<[typeof first, (event: SQSEvent) => Promise<SQSBatchResponse>, number]> = [
    [
      first,
      each(async ({ runId }) => {
        await send(second.url, await floorCheck(observed, runId));
      }),
      options.concurrency[0],
    ],
    [
      second,
      each(async (hop) => {
        const target = hop as FloorTarget;
        const response = await request(
          new URL(
            `/api/sandboxes/${encodeURIComponent(target.sandboxId)}?generation=${target.generation}`,
            options.provisionerUrl,
          ),
          { method: 'DELETE', dispatcher: http },
        );
        await response.body.dump();
        await send(third.url, target);
      }),
      options.concurrency[1],
    ],
    [
      third,
      each(async (hop) => {
        await floorClear(observed, hop as FloorTarget);
        await send(done.url, { runId: hop.runId });
      }),
      options.concurrency[2],
    ],
  ];
  const sources: EventSource[] = hops.map(([target, handler, concurrency], index) =>
    createEventSource({
      client: sqs,
      queueUrl: target.url,
      queueArn: target.arn,
      functionName: `floor-${index + 1}`,
      handler,
      batchSize: options.batchSizes[index]!,
      timeoutSeconds: 60,
      concurrency,
    }),
  );
  for (const source of sources) source.start();
  await Promise.all(sources.map((source) => source.polling));
  return {
    startUrl: first.url,
    doneUrl: done.url,
    sqsCalls: () => counter.snapshot(),
    takeLockHolds: () => holds.splice(0),
    db,
    async stop() {
      await Promise.all(sources.map((source) => source.stop()));
      await http.close();
      sqs.destroy();
    },
  };
}
