/**
 * The `runtime-cleanup-ops` bin as an on-call engineer runs it: the launcher
 * (bin/runtime-cleanup-ops.mjs) and the bundle `npm ci` builds (infra/ops/build-bundle.mjs), both
 * laid out in a directory of this file's own, started with node (not npm, whose banner is the
 * point), against a real PostgreSQL, a real SQS emulator and the local SSM server.
 *
 * `--stage` names a deployed stage: its queues carry the `<stage>-` prefix and its database URL is
 * read from the SecureString /runtime-cleanup/<stage>/database-url (serverless.yml), unless the
 * environment says otherwise.
 */
import { randomUUID } from 'node:crypto';
import { copyFile, mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deadLetterQueueName, QueueName } from '../../functions/adapters/queues.ts';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import { createQueues } from '../../infra/local/queue-setup.ts';
import { type ChildRun, runChild } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { finishedRootRun } from '../support/factories.ts';
import { type SqsEmulator, startSqsEmulator } from '../support/sqs-emulator.ts';
import { type LocalSsm, SDK_ENV, startLocalSsm } from '../support/ssm-server.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const LAUNCHER = join(ROOT, 'bin/runtime-cleanup-ops.mjs');
const CHILD_TIMEOUT_MS = 60_000;
const STAGE = 'oncall';
const PARAMETER = `/runtime-cleanup/${STAGE}/database-url`;
const RUN_FINISHED_DLQ = deadLetterQueueName(QueueName.RUN_FINISHED);

let t: TestDatabase;
let sqs: SqsEmulator;
let ssm: LocalSsm;
let installed: string;
let withoutBundle: string;
/** The database URL with a password in it, which no output may ever show. */
let secretUrl: string;
let password: string;

beforeAll(async () => {
  [t, sqs, ssm] = await Promise.all([createTestDatabase(), startSqsEmulator(), startLocalSsm()]);
  // The stage's own queues beside the base names startSqsEmulator made: one dead letter, in the
  // stage's run-finished DLQ only, tells which queues a command read.
  const stageQueues = await createQueues(sqs.client, { prefix: `${STAGE}-` });
  await sqs.client.send(
    new SendMessageCommand({
      QueueUrl: stageQueues.get(RUN_FINISHED_DLQ)!.url,
      MessageBody: JSON.stringify({ runId: `run-${randomUUID()}` }),
      MessageAttributes: { errorCode: { DataType: 'String', StringValue: 'PROVISIONER_REJECTED' } },
    }),
  );
  const url = new URL(t.url);
  // The suite's server lets the tests' user in without one (trust); a real password is kept as is.
  url.password ||= `pw-${randomUUID().slice(0, 12)}`;
  secretUrl = url.toString();
  password = decodeURIComponent(url.password);
  ssm.put(PARAMETER, { type: 'SecureString', value: secretUrl });

  // An installation as `npm ci` leaves it: bin/ and the bundle in dist/, built by the build script.
  const scratch = await mkdtemp(join(tmpdir(), 'rc-ops-bin-'));
  installed = join(scratch, 'installed');
  withoutBundle = join(scratch, 'without-bundle');
  await Promise.all([
    mkdir(join(installed, 'bin'), { recursive: true }),
    mkdir(join(withoutBundle, 'bin'), { recursive: true }),
  ]);
  await Promise.all([
    copyFile(LAUNCHER, join(installed, 'bin/runtime-cleanup-ops.mjs')),
    copyFile(LAUNCHER, join(withoutBundle, 'bin/runtime-cleanup-ops.mjs')),
  ]);
  const build = await runChild(
    process.execPath,
    [join(ROOT, 'infra/ops/build-bundle.mjs'), '--outfile', join(installed, 'dist/ops.mjs')],
    { cwd: ROOT, env: process.env, timeoutMs: CHILD_TIMEOUT_MS },
  );
  expect(build, 'the bundle builds').toMatchObject({ code: 0, stderr: '' });
}, 2 * CHILD_TIMEOUT_MS);

afterAll(async () => {
  await Promise.all([sqs?.stop(), ssm?.close(), t?.drop()]);
  if (installed) await rm(join(installed, '..'), { recursive: true, force: true });
});

/**
 * The bin from `root`, with only what the test names: the variables an operator's shell would
 * not have set are left out, so nothing but `--stage` can name the queues or the database.
 */
function bin(root: string, args: string[], env: Record<string, string> = {}): Promise<ChildRun> {
  const childEnv: NodeJS.ProcessEnv = {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? tmpdir(),
    // The run's driver (neon through the suite's bridge, or tcp), as every CLI test passes it.
    DATABASE_DRIVER: t.driver,
    DATABASE_WS_PROXY: t.wsProxy,
    ...SDK_ENV,
    AWS_ENDPOINT_URL_SQS: sqs.endpoint,
    AWS_ENDPOINT_URL_SSM: ssm.endpoint,
    ...env,
  };
  return runChild(process.execPath, [join(root, 'bin/runtime-cleanup-ops.mjs'), ...args], {
    cwd: tmpdir(),
    env: childEnv,
    timeoutMs: CHILD_TIMEOUT_MS,
  });
}

/** stdout exactly as JSON.parse takes it, with the whole run in the failure when it is not. */
function parsed<T = Record<string, unknown>>(run: ChildRun): T {
  try {
    return JSON.parse(run.stdout) as T;
  } catch {
    throw new Error(`stdout is not JSON (exit ${run.code}):\n${run.stdout}\nstderr:\n${run.stderr}`);
  }
}

function expectNoPassword(...runs: ChildRun[]): void {
  for (const run of runs) expect(run.stdout + run.stderr).not.toContain(password);
}

interface DlqResult {
  total: number;
  queues: Array<{ deadLetterQueue: string; messages: number }>;
}

describe('the runtime-cleanup-ops bin', { timeout: 3 * CHILD_TIMEOUT_MS }, () => {
  it("prints exactly the command's JSON on stdout with --json, results and errors alike", async () => {
    const fenced = await finishedRootRun(t.db);
    const [fences, unknownRun, help] = await Promise.all([
      bin(installed, ['fences', '--json'], { DATABASE_URL: secretUrl }),
      bin(installed, ['explain', 'run-does-not-exist', '--json'], { DATABASE_URL: secretUrl }),
      bin(installed, ['--help']),
    ]);
    expect(fences.code, fences.stderr).toBe(0);
    const { fences: listed } = parsed<{ fences: Array<{ runId: string }> }>(fences);
    expect(listed.map((fence) => fence.runId)).toContain(fenced.rootRunId);

    expect(unknownRun.code).toBe(1);
    expect(parsed(unknownRun)).toEqual({
      error: {
        code: 'RUN_NOT_FOUND',
        message: 'agent run "run-does-not-exist" does not exist',
        exitCode: 1,
      },
    });
    expect(help).toMatchObject({ code: 0, stdout: expect.stringContaining('--stage <name>') });
    expectNoPassword(fences, unknownRun);
  });

  it('--stage reads the database URL from the stage’s SSM parameter and uses the stage’s queues', async () => {
    const fenced = await finishedRootRun(t.db);
    ssm.requests.length = 0;
    const fences = await bin(installed, ['--stage', STAGE, 'fences', '--json']);
    expect(fences.code, fences.stderr).toBe(0);
    expect(parsed<{ fences: Array<{ runId: string }> }>(fences).fences.map((f) => f.runId)).toContain(
      fenced.rootRunId,
    );
    expect(ssm.requests).toEqual([{ name: PARAMETER, withDecryption: true, signedFor: 'ssm' }]);

    // dlq needs no database: SSM is not asked. Only the stage's DLQ holds a letter.
    ssm.requests.length = 0;
    const dlq = await bin(installed, ['dlq', '--json', `--stage=${STAGE}`]);
    expect(dlq.code, dlq.stderr).toBe(0);
    const report = parsed<DlqResult>(dlq);
    expect(report.total).toBe(1);
    expect(report.queues.find((q) => q.deadLetterQueue === RUN_FINISHED_DLQ)?.messages).toBe(1);
    expect(ssm.requests).toEqual([]);

    // check-config names where each value came from, and connects nowhere (SSM included).
    const config = await bin(installed, ['check-config', '--json', '--stage', STAGE]);
    expect(config.code, config.stderr).toBe(0);
    const settings = parsed<{ settings: Array<{ variable: string; value: string; source: string }> }>(
      config,
    ).settings;
    expect(settings).toEqual(
      expect.arrayContaining([
        { variable: 'QUEUE_NAME_PREFIX', value: `${STAGE}-`, source: 'stage' },
        { variable: 'DATABASE_URL_PARAMETER', value: PARAMETER, source: 'stage' },
      ]),
    );
    expect(ssm.requests).toEqual([]);
    expectNoPassword(fences, dlq, config);
  });

  it('--stage gives way to what the environment sets: DATABASE_URL is used as given, QUEUE_NAME_PREFIX too', async () => {
    ssm.requests.length = 0;
    const [fences, dlq] = await Promise.all([
      bin(installed, ['fences', '--json', '--stage', STAGE], { DATABASE_URL: secretUrl }),
      bin(installed, ['dlq', '--json', '--stage', STAGE], { QUEUE_NAME_PREFIX: '' }),
    ]);
    expect(fences.code, fences.stderr).toBe(0);
    expect(parsed(fences)).toHaveProperty('fences');
    expect(ssm.requests).toEqual([]);
    // The base names' DLQs, which hold nothing: not the stage's.
    expect(dlq.code, dlq.stderr).toBe(0);
    expect(parsed<DlqResult>(dlq).total).toBe(0);
    // ...and each says so on stderr, the password hidden: a shell still holding the last
    // incident's URL or prefix must not answer silently about another stage.
    expect(fences.stderr).toMatch(
      new RegExp(
        `--stage ${STAGE}: DATABASE_URL \\(.*\\) from the environment is used instead of SSM ${PARAMETER}`,
      ),
    );
    expect(dlq.stderr).toContain(
      `--stage ${STAGE}: QUEUE_NAME_PREFIX ("") from the environment is used instead of the queue prefix ${STAGE}-`,
    );
    expectNoPassword(fences, dlq);
  });

  it('--stage fails with exit 3 and the parameter’s name when the URL cannot be read or used, never showing it', async () => {
    const closedPort = await freePort();
    const unreachable = new URL(secretUrl);
    unreachable.port = String(closedPort);
    ssm.put('/runtime-cleanup/down/database-url', { type: 'SecureString', value: unreachable.toString() });
    ssm.put('/runtime-cleanup/plain/database-url', { type: 'String', value: secretUrl });
    const [missing, plain, down, badName] = await Promise.all([
      bin(installed, ['fences', '--json', '--stage', 'nowhere']),
      bin(installed, ['fences', '--stage', 'plain']),
      bin(installed, ['fences', '--stage', 'down']),
      bin(installed, ['fences', '--stage', 'no such stage']),
    ]);

    expect(missing.code).toBe(3);
    expect(parsed(missing)).toMatchObject({ error: { code: 'DATABASE_URL_UNREADABLE', exitCode: 3 } });
    expect(missing.stderr).toContain(
      'cannot read DATABASE_URL from SSM parameter /runtime-cleanup/nowhere/database-url: ParameterNotFound',
    );

    expect(plain.code).toBe(3);
    expect(plain.stderr).toContain('it is of type String; store the connection string as a SecureString');
    expect(plain.stderr).toContain('[DATABASE_URL_UNREADABLE]');

    expect(down.code).toBe(3);
    expect(down.stderr).toMatch(/cannot connect to the database.*DATABASE_UNAVAILABLE/);
    expect(down.stderr).toContain(`:${closedPort}/`);
    expect(down.stderr).toContain('from SSM parameter /runtime-cleanup/down/database-url');

    expect(badName.code).toBe(2);
    expect(badName.stderr).toContain('--stage "no such stage" is not a stage name');
    expectNoPassword(missing, plain, down, badName);
  });

  it('says how to build the bundle when it is missing, and exits 2 with nothing on stdout', async () => {
    const run = await bin(withoutBundle, ['fences', '--json']);
    expect(run.code).toBe(2);
    expect(run.stdout).toBe('');
    expect(run.stderr).toContain(`the CLI's bundle ${join(withoutBundle, 'dist/ops.mjs')} is missing`);
    expect(run.stderr).toContain('npm run build:ops');
  });
});
