/**
 * A whole local stack per test file, on its own ports (SQS emulator and provisioner on port 0),
 * against the file's own database. Retry delays and visibility timeouts are shortened so that
 * failure paths play out in seconds; their shape is the deployed one.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  DeleteMessageCommand,
  type Message,
  PurgeQueueCommand,
  ReceiveMessageCommand,
} from '@aws-sdk/client-sqs';
import type { Executor } from '../../functions/adapters/database.ts';
import { deadLetterQueueName, QueueName } from '../../functions/adapters/queues.ts';
import { PlatformSimulator } from '../../infra/local/platform.ts';
import { type Stack, type StackOptions, startStack } from '../../infra/local/stack.ts';
import type { TestDatabase } from './database.ts';
import { fenceOf } from './factories.ts';

export interface TestStack extends Stack {
  platform: PlatformSimulator;
  dataDir: string;
  /** Errors the event sources saw (a handler that threw instead of reporting item failures). */
  errors: Array<{ source: string; message: string }>;
  queueUrl(name: string): string;
  /** Receives (and deletes nothing) every message currently visible on a queue, with attributes. */
  peek(name: string, options?: { waitMs?: number }): Promise<Message[]>;
  /** Receives and deletes every message currently on a queue (e.g. runtime-cleaned). */
  drain(name: string): Promise<Message[]>;
  deadLetters(name: string): Promise<Message[]>;
  purge(name: string): Promise<void>;
}

export const FAST_RETRY_ENV = {
  CLEANUP_RETRY_BASE_SECONDS: '1',
  CLEANUP_RETRY_MAX_SECONDS: '2',
  FENCE_SWEEP_AFTER_SECONDS: '3600',
  FENCE_SWEEP_INTERVAL_SECONDS: '3600',
} as const;

export async function startTestStack(
  t: TestDatabase,
  options: { env?: Record<string, string>; stack?: Partial<StackOptions> } = {},
): Promise<TestStack> {
  const dataDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-stack-'));
  const errors: Array<{ source: string; message: string }> = [];
  const stack = await startStack({
    onError: (error, source) => errors.push({ source, message: error.message }),
    // The run's driver, through the variable the stack reads (its configuration is this env alone).
    env: { DATABASE_DRIVER: t.driver, ...FAST_RETRY_ENV, ...options.env },
    databaseUrl: t.url,
    wsProxy: t.wsProxy,
    sqsPort: 0,
    dataDir,
    logLevel: process.env.TEST_LOG_LEVEL ?? 'SILENT',
    provisionerGraceMs: 500,
    queueOverrides: {
      visibilityTimeoutSeconds: { 'run-finished': 5, 'runtime-release.fifo': 10, 'runtime-finalize': 5 },
    },
    ...options.stack,
  });
  const queueUrl = (name: string) => {
    const created = stack.createdQueues.get(name);
    if (!created) throw new Error(`no queue ${name}`);
    return created.url;
  };
  const receiveOnce = async (name: string, visibilitySeconds: number) =>
    (
      await stack.sqs.send(
        new ReceiveMessageCommand({
          QueueUrl: queueUrl(name),
          MaxNumberOfMessages: 10,
          WaitTimeSeconds: 0,
          VisibilityTimeout: visibilitySeconds,
          MessageAttributeNames: ['All'],
          MessageSystemAttributeNames: ['All'],
        }),
      )
    ).Messages ?? [];
  /** Looks without taking: visibility 0, so the messages stay available to their consumers. */
  const peek = async (name: string, waitMs = 0) => {
    const seen = new Map<string, Message>();
    const deadline = Date.now() + waitMs;
    do {
      for (const message of await receiveOnce(name, 0)) seen.set(message.MessageId!, message);
      if (Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50));
    } while (Date.now() < deadline);
    return [...seen.values()];
  };
  const drain = async (name: string) => {
    const taken: Message[] = [];
    for (;;) {
      const batch = await receiveOnce(name, 30);
      if (!batch.length) return taken;
      for (const message of batch) {
        await stack.sqs.send(
          new DeleteMessageCommand({ QueueUrl: queueUrl(name), ReceiptHandle: message.ReceiptHandle! }),
        );
        taken.push(message);
      }
    }
  };
  return {
    ...stack,
    dataDir,
    errors,
    platform: new PlatformSimulator(stack.db, stack.queues, stack.provisionerUrl, {
      token: stack.config.provisionerToken,
    }),
    queueUrl,
    peek: (name, peekOptions) => peek(name, peekOptions?.waitMs ?? 0),
    drain,
    deadLetters: (name) => peek(deadLetterQueueName(name)),
    purge: async (name) => {
      await stack.sqs.send(new PurgeQueueCommand({ QueueUrl: queueUrl(name) }));
    },
    async stop() {
      await stack.stop();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

/** Polls `check` until it returns a truthy value or the deadline passes (then throws with `what`). */
export async function eventually<T>(
  what: string,
  check: () => Promise<T | undefined | false>,
  timeoutMs = 20_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await check();
      if (value) return value;
    } catch (error) {
      last = error;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(
    `timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`,
  );
}

/** Waits until none of these runs' fences is pending. */
export async function fencesCleared(
  db: Executor,
  runIds: readonly string[],
  timeoutMs = 30_000,
): Promise<void> {
  await eventually(
    'every fence to clear',
    async () => {
      for (const runId of runIds) if (await fenceOf(db, runId)) return false;
      return true;
    },
    timeoutMs,
  );
}

/** Waits until the release of each of these runs is in the release queue's DLQ; returns the letters. */
export function releaseDeadLetters(
  stack: TestStack,
  runIds: readonly string[],
  timeoutMs = 30_000,
): Promise<Message[]> {
  return eventually(
    'every release in its DLQ',
    async () => {
      const found = (await stack.deadLetters(QueueName.RUNTIME_RELEASE)).filter((letter) =>
        runIds.some((runId) => letter.Body?.includes(runId)),
      );
      return found.length === runIds.length ? found : undefined;
    },
    timeoutMs,
  );
}
