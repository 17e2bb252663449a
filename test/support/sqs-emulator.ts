/**
 * An SQS emulator of a test file's own (fauxqs, in this process) with the contract's queues, for
 * tests of the operator CLI that need real queues but not the whole local stack.
 */
import { SQSClient } from '@aws-sdk/client-sqs';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import { type CreatedQueue, createQueues } from '../../infra/local/queue-setup.ts';

export interface SqsEmulator {
  endpoint: string;
  client: SQSClient;
  queues: Map<string, CreatedQueue>;
  stop(): Promise<void>;
}

export async function startSqsEmulator(): Promise<SqsEmulator> {
  const { startFauxqs } = await import('fauxqs');
  const port = await freePort();
  const fauxqs = await startFauxqs({ port, host: '127.0.0.1', logger: false });
  const endpoint = `http://127.0.0.1:${fauxqs.port}`;
  const client = new SQSClient({
    endpoint,
    region: 'us-east-1',
    credentials: { accessKeyId: 'test', secretAccessKey: 'test' },
  });
  const queues = await createQueues(client);
  return {
    endpoint,
    client,
    queues,
    async stop() {
      client.destroy();
      await fauxqs.stop();
    },
  };
}
