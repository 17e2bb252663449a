/**
 * File-level fixtures. Each `use…` call registers its vitest hooks and returns a live object whose
 * fields its `beforeAll` fills in. Call it at the top level of a test file, before the file's own
 * hooks; read the fields inside tests, hooks and the helpers they call, never at collection time:
 * the value is not there yet, and reading it then throws instead of handing out `undefined`.
 *
 * `beforeAll` hooks run in the order they were registered and `afterAll` hooks in the reverse
 * order (vitest's default `sequence.hooks: 'stack'`): a file's own `beforeAll` can use what the
 * fixtures made, and its own `afterAll` runs before the fixtures tear that down.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, afterEach, beforeAll } from 'vitest';
import { createQueues, createSqsClient, type Queues } from '../../functions/adapters/queues.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { createQueues as createQueuesOnEndpoint } from '../../infra/local/queue-setup.ts';
import { createTestDatabase, type TestDatabase } from './database.ts';
import { type TestProvider, testProvider } from './probes.ts';
import { startTestStack, type TestStack } from './stack.ts';

function ready<T>(value: T | undefined, what: string): T {
  if (value === undefined) throw new Error(`${what} is read before its beforeAll ran`);
  return value;
}

export interface DatabaseFixture {
  /** The file's own database, fresh and migrated; dropped after the file. */
  readonly t: TestDatabase;
}

/** A fresh test database for the file (createTestDatabase), dropped after its last test. */
export function useDatabaseFixture(): DatabaseFixture {
  let t: TestDatabase | undefined;
  beforeAll(async () => {
    t = await createTestDatabase();
  });
  afterAll(async () => {
    await t?.drop();
  });
  return {
    get t() {
      return ready(t, 'the test database');
    },
  };
}

export interface LocalProvisionerOptions {
  /** Prefix of the temporary directory that holds the sandboxes' work directories. */
  tempPrefix?: string;
  /** Time between SIGTERM and SIGKILL when a sandbox is stopped; 500 unless told. */
  graceMs?: number;
}

export interface LocalProvisionerFixture {
  readonly provisioner: LocalProvisioner;
  /** The temporary directory the sandboxes live in; removed after the file. */
  readonly rootDir: string;
  /** A provider over a real HTTP client to this provisioner; its client is closed after the file. */
  testProvider(timeouts?: Parameters<typeof testProvider>[1]): TestProvider;
}

/**
 * A real local provisioner for the file, in a temporary directory. Faults are cleared after every
 * test, so one test's injected failure never leaks into the next.
 */
export function useLocalProvisionerFixture(options: LocalProvisionerOptions = {}): LocalProvisionerFixture {
  let rootDir: string | undefined;
  let provisioner: LocalProvisioner | undefined;
  const providers: TestProvider[] = [];
  beforeAll(async () => {
    rootDir = await mkdtemp(join(tmpdir(), options.tempPrefix ?? 'rc-provisioner-'));
    provisioner = await startProvisioner({ rootDir, graceMs: options.graceMs ?? 500 });
  });
  afterEach(() => {
    provisioner?.clearFaults();
  });
  afterAll(async () => {
    // The clients first: each keeps sockets alive to the provisioner (see testProvider).
    await Promise.all(providers.map(({ client }) => client.close()));
    await provisioner?.stop();
    if (rootDir) await rm(rootDir, { recursive: true, force: true });
  });
  const fixture: LocalProvisionerFixture = {
    get provisioner() {
      return ready(provisioner, 'the local provisioner');
    },
    get rootDir() {
      return ready(rootDir, "the provisioner's directory");
    },
    testProvider(timeouts = {}) {
      const made = testProvider(fixture.provisioner.url, timeouts);
      providers.push(made);
      return made;
    },
  };
  return fixture;
}

export interface ProvisionerFixture extends DatabaseFixture, LocalProvisionerFixture {}

/** A fresh test database and a real local provisioner: what the protocol's phases run against. */
export function useProvisionerFixture(options: LocalProvisionerOptions = {}): ProvisionerFixture {
  const database = useDatabaseFixture();
  const local = useLocalProvisionerFixture(options);
  return {
    get t() {
      return database.t;
    },
    get provisioner() {
      return local.provisioner;
    },
    get rootDir() {
      return local.rootDir;
    },
    testProvider: (timeouts) => local.testProvider(timeouts),
  };
}

export interface SqsFixture {
  /** `http://127.0.0.1:<port>` of the emulator (what AWS_ENDPOINT_URL_SQS would name). */
  readonly endpoint: string;
  readonly sqs: SQSClient;
  /** The project's Queues client on the emulator, every queue of queues.json created. */
  readonly queues: Queues;
}

/** The fauxqs SQS emulator on a free port, with the project's queues and a Queues client on it. */
export function useSqsFixture(): SqsFixture {
  let sqs: SQSClient | undefined;
  let queues: Queues | undefined;
  let endpoint: string | undefined;
  let stopEmulator: (() => Promise<void>) | undefined;
  beforeAll(async () => {
    const { startFauxqs } = await import('fauxqs');
    const fauxqs = await startFauxqs({ port: 0, host: '127.0.0.1', logger: false });
    stopEmulator = () => fauxqs.stop();
    endpoint = `http://127.0.0.1:${fauxqs.port}`;
    sqs = createSqsClient({ endpoint });
    await createQueuesOnEndpoint(sqs);
    queues = createQueues({ client: sqs });
  });
  afterAll(async () => {
    sqs?.destroy();
    await stopEmulator?.();
  });
  return {
    get endpoint() {
      return ready(endpoint, 'the SQS endpoint');
    },
    get sqs() {
      return ready(sqs, 'the SQS client');
    },
    get queues() {
      return ready(queues, 'the queues');
    },
  };
}

export interface StackFixture extends DatabaseFixture {
  /** The whole local stack (startTestStack) on the file's database. */
  readonly stack: TestStack;
}

/** A fresh test database and a whole local stack on it, stopped after the file. */
export function useStackFixture(options?: Parameters<typeof startTestStack>[1]): StackFixture {
  const database = useDatabaseFixture();
  let stack: TestStack | undefined;
  beforeAll(async () => {
    stack = await startTestStack(database.t, options);
  });
  afterAll(async () => {
    await stack?.stop();
  });
  return {
    get t() {
      return database.t;
    },
    get stack() {
      return ready(stack, 'the test stack');
    },
  };
}
