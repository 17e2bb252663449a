/**
 * `npm run stack` stopped (SIGTERM) while a release waits on a provisioner that never answers its
 * DELETE: the stop aborts the request instead of waiting for SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS
 * (two minutes by default), says so, and exits 0; the fence stays up, which is what keeps an
 * aborted delete safe. The stack runs as the real child process, against a provisioner that is a
 * real HTTP server holding every DELETE open.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QueueName } from '../../functions/adapters/queues.ts';
import { commandArgs } from '../support/commands.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fenceOf, finishedRootRun } from '../support/factories.ts';
import { type SqsEmulator, startSqsEmulator } from '../support/sqs-emulator.ts';
import { eventually, startTestStack } from '../support/stack.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
/** Far beyond the child's whole budget below: a stop that waited for the DELETE could not pass. */
const DELETE_TIMEOUT_SECONDS = 300;
const STOP_BUDGET_MS = 30_000;

let t: TestDatabase;
let sqs: SqsEmulator;
let provisioner: Server;
let provisionerUrl: string;
const deletes: string[] = [];

beforeAll(async () => {
  t = await createTestDatabase();
  sqs = await startSqsEmulator();
  // Answers nothing to a DELETE, ever: a provisioner whose delete hangs.
  provisioner = createServer((request) => {
    if (request.method === 'DELETE') deletes.push(request.url ?? '');
  });
  await new Promise<void>((resolve) => provisioner.listen(0, '127.0.0.1', resolve));
  provisionerUrl = `http://127.0.0.1:${(provisioner.address() as AddressInfo).port}`;
});
afterAll(async () => {
  provisioner?.closeAllConnections();
  await new Promise<void>((resolve) => (provisioner ? provisioner.close(() => resolve()) : resolve()));
  await sqs?.stop();
  await t?.drop();
});

function startStackChild(): { child: ChildProcess; output: () => string; exited: Promise<number | null> } {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: t.url,
    DATABASE_WS_PROXY: t.wsProxy,
    AWS_ENDPOINT_URL_SQS: sqs.endpoint,
    QUEUE_NAME_PREFIX: '',
    SANDBOX_PROVISIONER_URL: provisionerUrl,
    SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: String(DELETE_TIMEOUT_SECONDS),
    SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: String(DELETE_TIMEOUT_SECONDS + 60),
    FENCE_SWEEP_INTERVAL_SECONDS: '3600',
  };
  const child = spawn(process.execPath, commandArgs('stack'), {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  child.stderr!.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  return { child, output: () => output, exited };
}

describe('npm run stack, stopped during a hung provisioner DELETE', () => {
  it('aborts the DELETE, says so, exits 0 within seconds, and leaves the fence up', async () => {
    const scenario = await finishedRootRun(t.db);
    const stack = startStackChild();
    try {
      await eventually('stack ready', async () => stack.output().includes('"message":"stack ready"'), 60_000);
      await sqs.client.send(
        new SendMessageCommand({
          QueueUrl: sqs.queues.get(QueueName.RUN_FINISHED)!.url,
          MessageBody: JSON.stringify({ runId: scenario.rootRunId }),
        }),
      );
      await eventually('the DELETE reached the provisioner', async () =>
        deletes.some((path) => path.includes(encodeURIComponent(scenario.sandboxId))),
      );

      stack.child.kill('SIGTERM');
      const code = await Promise.race([
        stack.exited,
        new Promise<'still running'>((resolve) => setTimeout(() => resolve('still running'), STOP_BUDGET_MS)),
      ]);
      expect(code, stack.output()).toBe(0);
      expect(stack.output()).toContain('provisioner DELETEs still in flight are aborted, not waited for');
      expect(stack.output()).toContain('"message":"stack stopped"');
      expect(await fenceOf(t.db, scenario.rootRunId)).toBe(true);
    } finally {
      stack.child.kill('SIGKILL');
    }
  });
});

describe('the stack stopped while one of its steps can never finish', () => {
  it('goes on without that step after its bound, names it, and still stops every step after it', async () => {
    const steps: string[] = [];
    const stack = await startTestStack(t, {
      stack: {
        stopStepTimeoutMs: 3_000,
        onStopStep: (step) => steps.push(step),
        sweeper: false,
        reclaimer: false,
      },
    });
    // A transaction whose work never returns keeps its connection checked out: the pool's end()
    // waits for it forever, and nothing that could end it (a timer, a socket event) is left.
    let entered: () => void = () => {};
    const inTransaction = new Promise<void>((resolve) => {
      entered = resolve;
    });
    void stack.db
      .withTransaction(async () => {
        entered();
        await new Promise(() => {});
      })
      .catch(() => {});
    await inTransaction;
    const sqsEndpoint = stack.sqsEndpoint;

    const stopped = await Promise.race([
      stack.stop().then(() => 'stopped' as const),
      new Promise<'still stopping'>((resolve) => setTimeout(() => resolve('still stopping'), STOP_BUDGET_MS)),
    ]);

    expect(stopped).toBe('stopped');
    expect(steps).toEqual(expect.arrayContaining(['event sources', 'database pool', 'SQS emulator']));
    expect(steps.indexOf('SQS emulator')).toBeGreaterThan(steps.indexOf('database pool'));
    expect(stack.errors).toContainEqual({
      source: 'stop',
      message: 'stopping the stack: database pool did not finish within 3000 ms; going on without it',
    });
    // The step after it ran: the emulator's port no longer answers.
    expect(stack.errors.filter((error) => error.source === 'stop')).toHaveLength(1);
    await expect(fetch(sqsEndpoint)).rejects.toThrow();
  });
});
