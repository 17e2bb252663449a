/**
 * The packaged bundles, unpacked as Lambda's nodejs22.x runtime lays them out, run under Node 22
 * against a real PostgreSQL over this pass's driver and a real local HTTP server speaking SSM's
 * GetParameter. The packagings are template-production.test.ts's and template.test.ts's (packaged
 * once per run: whichever file asks first packages them); what is asserted of the template alone is
 * there, in files that run once, since no database path can change a template.
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { METRICS_NAMESPACE, MetricName } from '../../functions/adapters/metric-names.ts';
import type { ChildRun } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { finishedRootRun } from '../support/factories.ts';
import {
  FUNCTION_KEYS,
  type FunctionKey,
  HANDLER_PATHS,
  runInTask,
  unpackForLambda,
  withPlainDatabaseUrl,
} from '../support/lambda-task.ts';
import {
  PRODUCTION_PACKAGING,
  packageProduction,
  packageService,
  packagingWorkDir,
} from '../support/packaged-template.ts';
import { type LocalSsm, startLocalSsm } from '../support/ssm-server.ts';
import { TemplateQueries } from '../support/template-queries.ts';

/** template-production.test.ts's packaging: the same stage and options. */
const STAGE = PRODUCTION_PACKAGING.stage;
/** template.test.ts's packaging: its sweeper runs with a plain DATABASE_URL, as locally. */
const CI_STAGE = 'ci';
const DATABASE_URL_PARAMETER = `/runtime-cleanup/${STAGE}/database-url`;
/** The functions that call the provisioner: release deletes, the reclaimer lists and deletes. */
const CALLS_PROVISIONER = new Set<string>(['release', 'reclaimer']);

let workDir: string;
let cfn: TemplateQueries<FunctionKey>;
let ciCfn: TemplateQueries<FunctionKey>;
let ciSweeperDir: string;
const taskDirs = new Map<FunctionKey, string>();
let t: TestDatabase;
let ssm: LocalSsm;

beforeAll(async () => {
  let home: string;
  ({ workDir, home } = await packagingWorkDir('bundles'));
  const packaged = await packageProduction({ outputDir: join(workDir, 'package'), home });
  cfn = new TemplateQueries(packaged.template, {
    service: 'runtime-cleanup',
    stage: STAGE,
    functionKeys: FUNCTION_KEYS,
  });
  for (const key of FUNCTION_KEYS) {
    const task = join(workDir, 'task', key);
    await unpackForLambda(packaged.artifacts.get(key)!, task);
    taskDirs.set(key, task);
  }
  const ci = await packageService({
    stage: CI_STAGE,
    outputDir: join(workDir, 'ci'),
    home,
    oncePerRun: true,
  });
  ciCfn = new TemplateQueries(ci.template, {
    service: 'runtime-cleanup',
    stage: CI_STAGE,
    functionKeys: FUNCTION_KEYS,
  });
  ciSweeperDir = join(workDir, 'ci-task', 'sweeper');
  await unpackForLambda(ci.artifacts.get('sweeper')!, ciSweeperDir);
  t = await createTestDatabase();
  ssm = await startLocalSsm();
  // Packaging waits its turn behind the other packaging files (PACKAGE_LOCK_WAIT_MS), then packages.
}, 330_000);

afterAll(async () => {
  await ssm?.close();
  await t?.drop();
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

function runBundle(key: FunctionKey, script: string, env: Record<string, string>): Promise<ChildRun> {
  const deployed = cfn.environmentOf(key);
  return runInTask(taskDirs.get(key)!, script, {
    PATH: process.env.PATH ?? '',
    AWS_REGION: 'us-east-1',
    AWS_ACCESS_KEY_ID: 'test-access-key',
    AWS_SECRET_ACCESS_KEY: 'test-secret-key',
    ...deployed,
    // The template's SSM reference is resolved by CloudFormation at deploy time.
    ...(deployed.SANDBOX_PROVISIONER_URL
      ? { SANDBOX_PROVISIONER_URL: 'http://provisioner.example.invalid' }
      : {}),
    BUNDLE: join(taskDirs.get(key)!, HANDLER_PATHS[key]),
    ...env,
  });
}

/** Invokes the bundle's handler `times` times with `event`; prints each outcome as one JSON line. */
const INVOKE = `
import { pathToFileURL } from 'node:url';
const { handler } = await import(pathToFileURL(process.env.BUNDLE).href);
const context = {
  functionName: 'f', functionVersion: '$LATEST', memoryLimitInMB: '256',
  invokedFunctionArn: 'arn:aws:lambda:us-east-1:000000000000:function:f', awsRequestId: 'r',
  logGroupName: '/aws/lambda/f', logStreamName: 's', callbackWaitsForEmptyEventLoop: true,
  getRemainingTimeInMillis: () => 30000, done() {}, fail() {}, succeed() {},
};
const event = JSON.parse(process.env.EVENT);
for (let i = 0; i < Number(process.env.TIMES ?? 1); i += 1) {
  const outcome = await handler(event, context).then(
    (result) => ({ ok: true, result }),
    (error) => ({ ok: false, name: error.name, message: error.message }),
  );
  console.log(JSON.stringify({ outcome }));
}
process.exit(0);
`;

function outcomes(run: ChildRun): Array<{ ok: boolean; result?: unknown; name?: string; message?: string }> {
  return run.stdout
    .split('\n')
    .filter((line) => line.startsWith('{"outcome"'))
    .map((line) => (JSON.parse(line) as { outcome: { ok: boolean } }).outcome);
}

function documents(run: ChildRun): Array<Record<string, unknown>> {
  return run.stdout
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

describe('the bundles against a real database and a real SSM endpoint', () => {
  it('read the database URL from its SecureString once per cold start, and count each forced clear once as ForcedClears', async () => {
    ssm.put(DATABASE_URL_PARAMETER, { type: 'SecureString', value: t.url });
    const s = await finishedRootRun(t.db);
    await t.db.query(
      `INSERT INTO runtime_cleanup_overrides (run_id, uid, runtime_scope_id, reason, actor)
       VALUES ($1::text, $2::text, $3::text, 'sandbox destroyed by hand', 'template-test')`,
      [s.rootRunId, s.uid, s.runtimeScopeId],
    );

    const run = await runBundle('sweeper', INVOKE, {
      EVENT: '{}',
      TIMES: '2',
      AWS_ENDPOINT_URL_SSM: ssm.endpoint,
      DATABASE_DRIVER: t.driver,
      DATABASE_WS_PROXY: t.wsProxy,
    });

    expect(run.code, run.stderr).toBe(0);
    expect(outcomes(run).map((outcome) => outcome.ok)).toEqual([true, true]);
    expect(ssm.requests).toEqual([{ name: DATABASE_URL_PARAMETER, withDecryption: true, signedFor: 'ssm' }]);
    const forcedClears = documents(run).filter((document) => MetricName.FORCED_CLEARS in document);
    expect(forcedClears.map((document) => document[MetricName.FORCED_CLEARS])).toEqual([1, 0]);
    const emf = forcedClears[0] as {
      _aws: { CloudWatchMetrics: Array<{ Namespace: string; Dimensions: string[][] }> };
    };
    expect(emf._aws.CloudWatchMetrics[0]!.Namespace).toBe(METRICS_NAMESPACE);
    expect([...emf._aws.CloudWatchMetrics[0]!.Dimensions[0]!].sort()).toEqual([
      'function',
      'service',
      'stage',
    ]);
    expect(forcedClears[0]).toMatchObject({ function: 'sweeper', service: 'runtime-cleanup', stage: STAGE });
    const password = decodeURIComponent(new URL(t.url).password);
    if (password) expect(run.stdout + run.stderr).not.toContain(password);
  });

  it('open the URL read from SSM with the driver its host calls for when DATABASE_DRIVER is unset: tcp for a self-hosted PostgreSQL', async () => {
    // No bridge and no DATABASE_DRIVER: the Neon driver could not reach this loopback PostgreSQL
    // at all (its WebSocket would go to the host's /v2), so an answer proves the tcp driver ran.
    ssm.put(DATABASE_URL_PARAMETER, { type: 'SecureString', value: t.url });
    const run = await runBundle('sweeper', INVOKE, {
      EVENT: '{}',
      AWS_ENDPOINT_URL_SSM: ssm.endpoint,
      // Empty is unset, whatever a stage's template puts there.
      DATABASE_DRIVER: '',
    });
    expect(run.code, run.stderr).toBe(0);
    expect(outcomes(run), run.stdout).toMatchObject([{ ok: true, result: { failed: [] } }]);
  });

  it('start fence-check, finalize and the sweeper with a broken SANDBOX_PROVISIONER_URL; only release and the reclaimer refuse it, in one line', async () => {
    ssm.put(DATABASE_URL_PARAMETER, { type: 'SecureString', value: t.url });
    const broken = {
      SANDBOX_PROVISIONER_URL: 'not a url',
      AWS_ENDPOINT_URL_SSM: ssm.endpoint,
      DATABASE_DRIVER: t.driver,
      DATABASE_WS_PROXY: t.wsProxy,
    };
    const runs = await Promise.all(
      FUNCTION_KEYS.map(async (key) => ({
        key,
        run: await runBundle(key, INVOKE, {
          ...broken,
          EVENT: key === 'sweeper' || key === 'reclaimer' ? '{}' : '{"Records":[]}',
        }),
      })),
    );
    for (const { key, run } of runs) {
      expect(run.code, `${key}: ${run.stderr}`).toBe(0);
      const [outcome] = outcomes(run);
      if (CALLS_PROVISIONER.has(key)) {
        expect(outcome).toMatchObject({
          ok: false,
          name: 'ConfigError',
          message: 'SANDBOX_PROVISIONER_URL="not a url" is invalid: must be an absolute URL',
        });
      } else {
        expect(outcome, `${key}: ${run.stdout}`).toMatchObject({ ok: true });
      }
    }
  });

  it('fail a cold start whose parameter cannot be read with one line naming it, never its value', async () => {
    // The keyword form libpq accepts and the Neon driver does not: a plausible mistake.
    ssm.put(DATABASE_URL_PARAMETER, {
      type: 'SecureString',
      value: 'host=db.internal user=cleanup password=leaked-password dbname=app',
    });
    const run = await runBundle('fenceCheck', INVOKE, {
      EVENT: '{"Records":[]}',
      AWS_ENDPOINT_URL_SSM: ssm.endpoint,
    });
    const [outcome] = outcomes(run);
    expect(outcome).toMatchObject({ ok: false, name: 'DatabaseUrlUnreadableError' });
    expect(outcome!.message).toBe(
      `cannot read DATABASE_URL from SSM parameter ${DATABASE_URL_PARAMETER}: its value is not a postgres:// or postgresql:// URL (value not shown)`,
    );
    expect(run.stdout + run.stderr).not.toContain('leaked-password');
  });
});

describe('the sweeper bundle against a real database', () => {
  let t: TestDatabase;
  beforeAll(async () => {
    t = await createTestDatabase();
  });
  afterAll(async () => {
    await t?.drop();
  });

  it('emits OldestFenceAge with exactly the dimensions its alarm and its dashboard graph name', async () => {
    const script = `
      import { pathToFileURL } from 'node:url';
      const { handler } = await import(pathToFileURL(process.env.BUNDLE).href);
      const context = {
        functionName: 'runtime-cleanup-ci-sweeper', functionVersion: '$LATEST', memoryLimitInMB: '256',
        invokedFunctionArn: 'arn:aws:lambda:us-east-1:000000000000:function:runtime-cleanup-ci-sweeper',
        awsRequestId: 'template-test', logGroupName: '/aws/lambda/runtime-cleanup-ci-sweeper',
        logStreamName: 'template-test', callbackWaitsForEmptyEventLoop: true,
        getRemainingTimeInMillis: () => 60000, done() {}, fail() {}, succeed() {},
      };
      const result = await handler({}, context);
      process.stdout.write(JSON.stringify({ sweepResult: result }) + '\\n', () => process.exit(0));
    `;
    const run = await runInTask(
      ciSweeperDir,
      script,
      withPlainDatabaseUrl(ciCfn.environmentOf('sweeper'), {
        BUNDLE: join(ciSweeperDir, HANDLER_PATHS.sweeper),
        DATABASE_URL: t.url,
        DATABASE_DRIVER: t.driver,
        DATABASE_WS_PROXY: t.wsProxy,
      }),
    );
    expect(run.code, run.stderr + run.stdout).toBe(0);
    const documents = run.stdout
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(documents.at(-1)).toMatchObject({ sweepResult: { pendingFences: 0 } });
    const emf = documents.find((document) => MetricName.OLDEST_FENCE_AGE in document) as
      | ({ _aws: { CloudWatchMetrics: Array<{ Namespace: string; Dimensions: string[][] }> } } & Record<
          string,
          unknown
        >)
      | undefined;
    expect(emf, run.stdout).toBeDefined();
    const [directive] = emf!._aws.CloudWatchMetrics;
    expect(directive!.Namespace).toBe(METRICS_NAMESPACE);
    const emitted = Object.fromEntries(directive!.Dimensions[0]!.map((name) => [name, emf![name]]));

    const alarm = ciCfn
      .alarms()
      .find(([, candidate]) => candidate.MetricName === MetricName.OLDEST_FENCE_AGE)?.[1];
    const dimensions = (alarm?.Dimensions ?? []) as Array<{ Name: string; Value: string }>;
    const watched = Object.fromEntries(dimensions.map(({ Name, Value }) => [Name, Value]));
    expect(watched).toEqual(emitted);
    expect(emitted).toMatchObject({ stage: CI_STAGE, function: 'sweeper' });

    const graphed = ciCfn
      .dashboardCustomMetrics()
      .find(({ metric }) => metric === MetricName.OLDEST_FENCE_AGE);
    expect(graphed?.schema.sort()).toEqual(Object.keys(emitted).sort());
  });
});
