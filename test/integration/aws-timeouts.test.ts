import type { AddressInfo } from 'node:net';
import { createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { boundedAwsClientOptions } from '../../functions/adapters/aws-clients.ts';
import { createSsmClient, ssmDatabaseUrl } from '../../functions/adapters/database-url.ts';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { createQueues, createSqsClient } from '../../functions/adapters/queues.ts';
import { runChild } from '../support/child-process.ts';
import { PROJECT_ROOT } from '../support/packaged-template.ts';

/**
 * An AWS endpoint that accepts the connection and never answers (a stuck proxy, a half-dead
 * emulator): every SQS and SSM call must fail within its bounds, with a clear error, instead of
 * hanging the function (or `npm run ops`, `npm run stack`) forever. Proven with the real SDK
 * clients, built exactly as the functions build them, against a real TCP server that reads what
 * it is sent and never writes a byte.
 */
let blackHole: Server;
let endpoint: string;
const sockets = new Set<Socket>();
let connections = 0;

beforeAll(async () => {
  blackHole = createServer((socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on('data', () => {}); // read everything, answer nothing
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => blackHole.listen(0, '127.0.0.1', resolve));
  endpoint = `http://127.0.0.1:${(blackHole.address() as AddressInfo).port}`;
});
afterAll(async () => {
  for (const socket of sockets) socket.destroy();
  await new Promise((resolve) => blackHole?.close(resolve));
});

/** Short bounds so the test takes a second; the production values are only larger. */
const timeouts = { connectTimeoutMs: 500, requestTimeoutMs: 400 };
const SDK_ENV = { AWS_REGION: 'us-east-1', AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test' };

describe('an AWS endpoint that accepts and never answers', () => {
  it('fails an SQS send with QUEUE_UNAVAILABLE naming the timeout, after the SDK’s attempts', async () => {
    const before = connections;
    const queues = createQueues({ endpoint, client: createSqsClient({ endpoint, timeouts }) });
    try {
      const error = await queues.send('run-finished', { runId: 'r' }).then(
        () => {
          throw new Error('the send succeeded against a server that never answers');
        },
        (failure: unknown) => failure as Error & { code: string },
      );
      expect(error.code).toBe(InfrastructureErrorCode.QUEUE_UNAVAILABLE);
      expect(error.message).toMatch(/SQS GetQueueUrl on run-finished failed: TimeoutError/);
      expect(error.message).toContain('requestTimeout');
      // Each of the SDK's attempts really reached the server and timed out (no silent hang).
      expect(connections - before).toBe(boundedAwsClientOptions().maxAttempts);
    } finally {
      queues.client.destroy();
    }
  });

  it('fails the cold start’s SSM read with DATABASE_URL_UNREADABLE naming the timeout', async () => {
    const saved = { ...process.env };
    Object.assign(process.env, SDK_ENV, { AWS_ENDPOINT_URL_SSM: endpoint });
    const client = createSsmClient(timeouts);
    try {
      const source = ssmDatabaseUrl({ client, parameterName: '/runtime-cleanup/test/database-url' });
      const error = (await source.current().catch((failure: unknown) => failure)) as Error & { code: string };
      expect(error.code).toBe(InfrastructureErrorCode.DATABASE_URL_UNREADABLE);
      expect(error.message).toMatch(/cannot read DATABASE_URL from SSM parameter .*: TimeoutError/);
    } finally {
      client.destroy();
      for (const name of ['AWS_ENDPOINT_URL_SSM', ...Object.keys(SDK_ENV)]) {
        if (saved[name] === undefined) delete process.env[name];
        else process.env[name] = saved[name];
      }
    }
  });

  it('ends `npm run ops -- dlq` with exit 3 and the reason, on the production bounds', async () => {
    const run = await runChild('npm', ['run', '--silent', 'ops', '--', 'dlq'], {
      cwd: PROJECT_ROOT,
      env: { ...process.env, ...SDK_ENV, AWS_ENDPOINT_URL_SQS: endpoint },
      // Killed (and the test failed on its output) if it hangs: the bound is 3 × 5 s plus retries.
      timeoutMs: 60_000,
    });
    expect(run.code, run.stderr).toBe(3);
    expect(run.stderr).toMatch(/TimeoutError/);
    expect(run.stderr).toContain(`requestTimeout`);
  }, 70_000);
});
