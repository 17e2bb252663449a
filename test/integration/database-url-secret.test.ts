import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import type { SQSEvent } from 'aws-lambda';
import { afterAll, beforeAll, beforeEach, describe, expect, inject, it, onTestFinished } from 'vitest';
import { databasePoolSize } from '../../functions/adapters/connection-budget.ts';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { DATABASE_DRIVERS, type DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { deployedInfrastructure } from '../../functions/adapters/deployed-infrastructure.ts';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { lambdaEntry } from '../../functions/adapters/lambda.ts';
import { deadLetterQueueName, QueueName } from '../../functions/adapters/queues.ts';
import { composeFenceCheck } from '../../functions/fence-check/handler.ts';
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { localLambdaContext } from '../../infra/local/event-source.ts';
import { startStack } from '../../infra/local/stack.ts';
import { migrate } from '../../infra/migrate.ts';
import { createOpsContext } from '../../infra/ops/context.ts';
import { runChild } from '../support/child-process.ts';
import { TEST_CONNECT_TIMEOUT_MS } from '../support/connect-bound.ts';
import { useSqsFixture } from '../support/fixtures.ts';
import { PROJECT_ROOT } from '../support/packaged-template.ts';
import { overrideProcessEnv } from '../support/process-env.ts';
import { sqsRecord } from '../support/sqs-record.ts';
import { type LocalSsm, SDK_ENV, startLocalSsm } from '../support/ssm-server.ts';

/**
 * The deployed functions read DATABASE_URL from an SSM SecureString at cold start, keep it for the
 * container's life, and read it once more when the database refuses the credentials (a rotated
 * password). Proven with the real SDK client against a real local HTTP server speaking
 * GetParameter, and a real PostgreSQL that checks passwords (embedded-postgres with SCRAM: the
 * machine's own PostgreSQL trusts every login, so it could never refuse one). The composition
 * root under test is fence-check's, driven through the same `lambdaEntry` as the deployed handler.
 * Over both drivers: each reports a refused password as 28P01, and each must hide it.
 */
const PARAMETER = '/runtime-cleanup/test/database-url';
const ROLE = 'rotating_cleanup';
const sqsFixture = useSqsFixture();

let ssm: LocalSsm;
let postgres: EmbeddedPostgresHandle;
let postgresDir: string;
let admin: Database;
let wsProxy: string;
let restoreEnv: (() => void) | undefined;

beforeAll(async () => {
  ({ wsProxy } = inject('database'));
  ssm = await startLocalSsm();
  postgresDir = await mkdtemp(join(tmpdir(), 'rc-scram-pg-'));
  postgres = await startEmbeddedPostgres({ dataDir: postgresDir, persistent: false });
  admin = await openDatabase({
    url: postgres.url,
    driver: inject('database').driver,
    wsProxy,
    lockTimeoutMs: 5_000,
    statementTimeoutMs: 60_000,
  });
  await migrate(admin);
  await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD 'alpha-password'`);
  await admin.query(`GRANT ALL ON ALL TABLES IN SCHEMA public TO ${ROLE}`);
  await admin.query(`GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO ${ROLE}`);
  restoreEnv = overrideProcessEnv({ ...SDK_ENV, AWS_ENDPOINT_URL_SSM: ssm.endpoint });
});

afterAll(async () => {
  restoreEnv?.();
  await admin?.end();
  await postgres?.stop();
  if (postgresDir) await rm(postgresDir, { recursive: true, force: true });
  await ssm?.close();
});

beforeEach(() => {
  ssm.requests.length = 0;
  ssm.failWith(PARAMETER, undefined);
});

/** The role's URL on the SCRAM-checking PostgreSQL, with the given password. */
function urlWith(password: string, extra = ''): string {
  const url = new URL(postgres.url);
  url.username = ROLE;
  url.password = password;
  return `${url.toString()}${extra}`;
}

/**
 * The environment a deployed fence-check function sees: no DATABASE_URL, only the parameter's
 * name (and the driver: this URL's loopback host would otherwise always mean tcp).
 */
function lambdaEnv(driver: DatabaseDriver): Record<string, string> {
  return {
    ...SDK_ENV,
    DATABASE_URL_PARAMETER: PARAMETER,
    DATABASE_DRIVER: driver,
    DATABASE_WS_PROXY: wsProxy,
    AWS_ENDPOINT_URL_SQS: sqsFixture.endpoint,
    CLEANUP_RETRY_BASE_SECONDS: '1',
    CLEANUP_RETRY_MAX_SECONDS: '2',
  };
}

/** Unknown runs: each record runs a real fence-check transaction, then goes to the DLQ with RUN_NOT_FOUND. */
function unknownRuns(count: number): SQSEvent {
  return {
    Records: Array.from({ length: count }, () =>
      sqsRecord(JSON.stringify({ runId: `ghost-${randomUUID()}` })),
    ),
  };
}

async function deadLettered(): Promise<string[]> {
  const url = await sqsFixture.queues.url(deadLetterQueueName(QueueName.RUN_FINISHED));
  const codes: string[] = [];
  for (;;) {
    const { Messages } = await sqsFixture.sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: url,
        MaxNumberOfMessages: 10,
        MessageAttributeNames: ['All'],
        VisibilityTimeout: 60,
      }),
    );
    if (!Messages?.length) return codes;
    codes.push(...Messages.map((message) => message.MessageAttributes?.errorCode?.StringValue ?? '?'));
  }
}

/** Runs `work` and returns the JSON lines it logged to stdout and stderr (hidden from the test output). */
async function captureLogLines(work: () => Promise<unknown>): Promise<Array<Record<string, unknown>>> {
  const streams = [process.stdout, process.stderr];
  const originals = streams.map((stream) => stream.write.bind(stream));
  let buffer = '';
  for (const stream of streams) {
    stream.write = ((chunk: string | Uint8Array) => {
      buffer += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
      return true;
    }) as typeof stream.write;
  }
  try {
    await work();
  } finally {
    streams.forEach((stream, index) => {
      stream.write = originals[index]!;
    });
  }
  return buffer
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

function coldStart(driver: DatabaseDriver) {
  return lambdaEntry(() => composeFenceCheck(deployedInfrastructure(lambdaEnv(driver))));
}

describe.each(DATABASE_DRIVERS)('over the %s driver', (driver) => {
  describe('the database URL from an SSM SecureString', () => {
    it('is read once at cold start, signed for SSM with decryption, and kept for the next invocations', async () => {
      ssm.put(PARAMETER, { type: 'SecureString', value: urlWith('alpha-password') });
      const handler = coldStart(driver);

      for (let invocation = 0; invocation < 3; invocation += 1) {
        const response = await handler(unknownRuns(2), localLambdaContext('fence-check', 30));
        expect(response.batchItemFailures).toEqual([]);
      }

      expect(ssm.requests).toEqual([{ name: PARAMETER, withDecryption: true, signedFor: 'ssm' }]);
      expect(await deadLettered()).toEqual(Array(6).fill('RUN_NOT_FOUND'));
    });

    it('is read again once when the database refuses the rotated password, and the work goes on with the new one', async () => {
      ssm.put(PARAMETER, { type: 'SecureString', value: urlWith('alpha-password') });
      const handler = coldStart(driver);
      // One record: the pool opens one connection, and keeps it idle afterwards.
      expect(
        (await handler(unknownRuns(1), localLambdaContext('fence-check', 30))).batchItemFailures,
      ).toEqual([]);
      expect(ssm.requests).toHaveLength(1);

      // The rotation: the database takes the new password first, then the parameter is updated.
      await admin.query(`ALTER ROLE ${ROLE} PASSWORD 'beta-password'`);
      onTestFinished(() => admin.query(`ALTER ROLE ${ROLE} PASSWORD 'alpha-password'`).then(() => {}));
      ssm.put(PARAMETER, { type: 'SecureString', value: urlWith('beta-password') });

      // Records run in parallel: beyond the idle connection the pool must log in again, and the
      // database refuses the old password (28P01).
      const batch = unknownRuns(databasePoolSize('fenceCheck') + 2);
      const response = await handler(batch, localLambdaContext('fence-check', 30));

      expect(response.batchItemFailures).toEqual([]);
      expect(ssm.requests).toHaveLength(2);
      expect(await deadLettered()).toEqual(Array(1 + batch.Records.length).fill('RUN_NOT_FOUND'));
    });

    it('fails the record retryably with DATABASE_AUTH_FAILED when the parameter still holds a refused password, after exactly one more read', async () => {
      ssm.put(PARAMETER, { type: 'SecureString', value: urlWith('wrong-password') });
      const handler = coldStart(driver);
      const batch = unknownRuns(1);

      const lines = await captureLogLines(() => handler(batch, localLambdaContext('fence-check', 30)));

      // Retryable: reported as a failed item (it comes back with backoff), not dead-lettered.
      const failed = lines.find((line) => line.message === 'attempt failed; will retry');
      expect(failed?.errorCode).toBe(InfrastructureErrorCode.DATABASE_AUTH_FAILED);
      expect(await deadLettered()).toEqual([]);
      // The cold start's read and one more: no loop of reads against a secret that is still wrong.
      expect(ssm.requests).toHaveLength(2);
      expect(JSON.stringify(lines)).not.toContain('wrong-password');
    });

    it('fails a cold start with one line naming the parameter and why, never its value', async () => {
      const cases = [
        {
          setup: () => ssm.failWith(PARAMETER, { type: 'ParameterNotFound', message: '' }),
          why: 'ParameterNotFound',
        },
        {
          setup: () =>
            ssm.failWith(PARAMETER, {
              type: 'AccessDeniedException',
              message: `User: arn:aws:sts::000000000000:assumed-role/x is not authorized to perform: ssm:GetParameter on resource: ${PARAMETER}`,
            }),
          why: 'AccessDeniedException',
        },
        {
          setup: () => ssm.put(PARAMETER, { type: 'String', value: urlWith('plain-text-password') }),
          why: 'of type String',
        },
        {
          setup: () => ssm.put(PARAMETER, { type: 'SecureString', value: 'not-a-url plain-text-password' }),
          why: 'not a postgres:// or postgresql:// URL',
        },
      ];
      for (const { setup, why } of cases) {
        ssm.failWith(PARAMETER, undefined);
        setup();
        const handler = coldStart(driver);
        const failure = await handler(unknownRuns(1), localLambdaContext('fence-check', 30)).then(
          () => undefined,
          (error: Error) => error,
        );
        expect(failure, why).toBeInstanceOf(Error);
        const message = failure!.message;
        expect(message.split('\n'), why).toHaveLength(1);
        expect(message, why).toContain(`SSM parameter ${PARAMETER}`);
        expect(message, why).toContain(why);
        expect(message, why).not.toContain('plain-text-password');
        expect(JSON.stringify(failure), why).not.toContain('plain-text-password');
      }
    });
  });

  describe('a rotation while the pool is full', () => {
    it('serves the work queued behind a refused login on the new credentials, none left waiting', async () => {
      await admin.query(`ALTER ROLE ${ROLE} PASSWORD 'alpha-password'`);
      let rereads = 0;
      const db = await openDatabase({
        url: urlWith('alpha-password'),
        rereadUrl: async () => {
          rereads += 1;
          return urlWith('beta-password');
        },
        driver,
        wsProxy,
        maxConnections: 2,
        lockTimeoutMs: 5_000,
        statementTimeoutMs: 30_000,
        // What is proven is who is served, not how fast a login is: a loaded machine once took
        // longer than the production connect bound, and the test failed on that instead.
        connectTimeoutMs: TEST_CONNECT_TIMEOUT_MS,
      });
      // One transaction keeps the pool's only login busy until the gate opens (below); a test that
      // fails before then must still open it, or ending the pool waits for it forever (seen: the
      // hook's 120 s bound, and the file's later tests then saw this one's dead letters again).
      let release: () => void = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      onTestFinished(async () => {
        release();
        await admin.query(`ALTER ROLE ${ROLE} PASSWORD 'alpha-password'`);
        await db.end();
      });
      await db.query('SELECT 1');
      await admin.query(`ALTER ROLE ${ROLE} PASSWORD 'beta-password'`);

      // Four more statements need the second slot, so three of them queue in the pool behind a
      // login the database refuses.
      let holding: () => void = () => {};
      const isHolding = new Promise<void>((resolve) => {
        holding = resolve;
      });
      const held = db.withTransaction(async (tx) => {
        await tx.query('SELECT 1');
        holding();
        await gate;
      });
      await isHolding;
      const queued = Promise.all(
        Array.from({ length: 4 }, (_, i) => db.query<{ n: number }>('SELECT $1::int AS n', [i])),
      );
      let stuck: NodeJS.Timeout | undefined;
      const answers = await Promise.race([
        queued,
        new Promise<never>((_, reject) => {
          stuck = setTimeout(() => reject(new Error('work queued in the old pool was never served')), 15_000);
        }),
      ]).finally(() => clearTimeout(stuck));
      expect(answers.map((answer) => answer.rows[0]?.n)).toEqual([0, 1, 2, 3]);
      expect(rereads).toBe(1);
      release();
      await held;
    });
  });
});

describe('the local commands', () => {
  it('refuse the deployed parameter without a DATABASE_URL instead of using the local default database', async () => {
    const env = { DATABASE_URL_PARAMETER: PARAMETER };
    const refusal =
      /DATABASE_URL="" is invalid: is required here: this command does not read DATABASE_URL_PARAMETER/;
    await expect(startStack({ env, sqsPort: 0 })).rejects.toThrow(refusal);
    expect(() => createOpsContext(env)).toThrow(refusal);
    const migrateRun = await runChild('npm', ['run', '--silent', 'migrate'], {
      cwd: PROJECT_ROOT,
      // The Neon driver through a bridge address nothing listens on: should the refusal ever go,
      // the command fails to connect instead of migrating the machine's default database (over tcp,
      // the loopback default's own driver, it would reach it).
      env: {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? '/tmp',
        DATABASE_DRIVER: 'neon',
        DATABASE_WS_PROXY: '127.0.0.1:9',
        ...env,
      },
      timeoutMs: 60_000,
    });
    expect(migrateRun.code).not.toBe(0);
    expect(migrateRun.stderr).toMatch(refusal);
    expect(migrateRun.stdout).not.toContain('migrations applied');
  });
});

describe.each(DATABASE_DRIVERS)('over the %s driver: the deployed pool', (driver) => {
  it('opens at most the function’s databasePoolSize connections, however much work waits', async () => {
    const applicationName = `rc-pool-${randomUUID().slice(0, 8)}`;
    ssm.put(PARAMETER, {
      type: 'SecureString',
      value: urlWith('alpha-password', `?application_name=${applicationName}`),
    });
    const infrastructure = deployedInfrastructure(lambdaEnv(driver));
    const telemetry = infrastructure.telemetry('fenceCheck');
    const db = await infrastructure.database('fenceCheck', telemetry);
    const size = databasePoolSize('fenceCheck');
    let entered = 0;
    let allIn: () => void = () => {};
    const poolFull = new Promise<void>((resolve) => {
      allIn = resolve;
    });
    let open: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const work = Array.from({ length: size + 3 }, () =>
      db.withTransaction(async (tx) => {
        await tx.query('SELECT 1');
        entered += 1;
        if (entered === size) allIn();
        await gate;
      }),
    );
    // A pool that fails instead of filling up fails the test here, not at its timeout.
    await Promise.race([
      poolFull,
      Promise.all(work).then(() => {
        throw new Error('all the work finished without the pool ever being full');
      }),
    ]);
    const { rows } = await admin.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1::text',
      [applicationName],
    );
    expect(rows[0]!.n).toBe(size);
    expect(entered).toBe(size);
    open();
    await Promise.all(work);
    expect(entered).toBe(size + 3);
    await db.end();
  });
});
