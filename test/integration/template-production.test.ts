import { rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONFIG_DEFAULTS } from '../../functions/adapters/config.ts';
import { connectionBudget } from '../../functions/adapters/connection-budget.ts';
import { METRICS_NAMESPACE } from '../../functions/adapters/metric-names.ts';
import {
  deadLetterQueueName,
  FUNCTION_DEFINITIONS,
  QUEUE_DEFINITIONS,
} from '../../functions/adapters/queues.ts';
import { runChild } from '../support/child-process.ts';
import { FUNCTION_KEYS, type FunctionKey, HANDLER_PATHS } from '../support/lambda-task.ts';
import {
  type CfnResource,
  type CfnTemplate,
  PRODUCTION_ALARM_SUBSCRIPTION,
  PRODUCTION_PACKAGING,
  PROJECT_ROOT,
  packageProduction,
  packagingWorkDir,
  readZip,
  referencedLogicalId,
  resourcesOfType,
  runPackage,
  substituteForInspection,
} from '../support/packaged-template.ts';

/**
 * What a first production deploy needs, asserted on the packaged artifact (`npm run package`,
 * offline): no connection string in any function's environment and a read path for it that is
 * exactly one parameter and one key wide; a database connection budget that holds; loops,
 * retries and retention chosen on purpose; alarms that reach a person; and bundles that carry only
 * what each function uses. The same bundles run under Node 22 against a real PostgreSQL and a real
 * local HTTP server speaking SSM's GetParameter in packaged-bundles.test.ts, once per database pass.
 */
const STAGE = PRODUCTION_PACKAGING.stage;
const PREFIX = `${STAGE}-`;
const DATABASE_URL_PARAMETER = `/runtime-cleanup/${STAGE}/database-url`;
const PROVISIONER_URL_PARAMETER = `/runtime-cleanup/${STAGE}/sandbox-provisioner-url`;

/** The functions that call the provisioner: release deletes, the reclaimer lists and deletes. */
const CALLS_PROVISIONER = new Set<string>(['release', 'reclaimer']);

let workDir: string;
let home: string;
let template: CfnTemplate;
const bundles = new Map<FunctionKey, string>();

beforeAll(async () => {
  ({ workDir, home } = await packagingWorkDir('production'));
  // Packaged once per run: packaged-bundles.test.ts (every database pass) runs these same zips.
  const packaged = await packageProduction({ outputDir: join(workDir, 'package'), home });
  template = packaged.template;
  for (const key of FUNCTION_KEYS) {
    const entries = await readZip(packaged.artifacts.get(key)!);
    bundles.set(key, entries.get(HANDLER_PATHS[key])!.toString('utf8'));
  }
  // Packaging waits its turn behind the other packaging files (PACKAGE_LOCK_WAIT_MS), then packages.
}, 330_000);

afterAll(async () => {
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

// ---------------------------------------------------------------------------------------------
// Reading the template

const asList = <T>(value: T | T[]): T[] => (Array.isArray(value) ? value : [value]);

function lambdaFunction(key: FunctionKey): { id: string; properties: Record<string, unknown> } {
  const name = `runtime-cleanup-${STAGE}-${key}`;
  const found = resourcesOfType(template, 'AWS::Lambda::Function').find(
    ([, candidate]) => candidate.Properties?.FunctionName === name,
  );
  if (!found) throw new Error(`no Lambda function named ${name}`);
  return { id: found[0], properties: found[1].Properties ?? {} };
}

function environmentOf(key: FunctionKey): Record<string, string> {
  return ((lambdaFunction(key).properties.Environment as { Variables?: Record<string, string> })?.Variables ??
    {}) as Record<string, string>;
}

interface Statement {
  Sid?: string;
  Effect: string;
  Action: string | string[];
  Resource: unknown;
  Condition?: Record<string, Record<string, unknown>>;
}

function statementsOf(key: FunctionKey): Statement[] {
  const role = template.Resources[referencedLogicalId(lambdaFunction(key).properties.Role)!]!;
  return ((role.Properties?.Policies ?? []) as Array<{ PolicyDocument: { Statement: Statement[] } }>).flatMap(
    (policy) => policy.PolicyDocument.Statement,
  );
}

function queueByName(baseName: string): [string, CfnResource] {
  const found = resourcesOfType(template, 'AWS::SQS::Queue').find(
    ([, queue]) => queue.Properties?.QueueName === `${PREFIX}${baseName}`,
  );
  if (!found) throw new Error(`no queue ${PREFIX}${baseName}`);
  return found;
}

function alarms(): Array<[string, Record<string, unknown>]> {
  return resourcesOfType(template, 'AWS::CloudWatch::Alarm').map(([id, alarm]) => [
    id,
    alarm.Properties ?? {},
  ]);
}

function lambdaAlarm(metric: string, key: FunctionKey): Record<string, unknown> | undefined {
  const functionId = lambdaFunction(key).id;
  return alarms().find(
    ([, alarm]) =>
      alarm.Namespace === 'AWS/Lambda' &&
      alarm.MetricName === metric &&
      referencedLogicalId((alarm.Dimensions as Array<{ Value: unknown }>)[0]?.Value) === functionId,
  )?.[1];
}

function mappingOf(key: FunctionKey): Record<string, unknown> | undefined {
  const functionId = lambdaFunction(key).id;
  return resourcesOfType(template, 'AWS::Lambda::EventSourceMapping').find(
    ([, mapping]) => referencedLogicalId(mapping.Properties?.FunctionName) === functionId,
  )?.[1].Properties;
}

/** What `Fn::Sub` text would become with the pseudo parameters of one account and region. */
function substituted(value: unknown): string {
  const text = (value as { 'Fn::Sub'?: string })['Fn::Sub'];
  if (typeof text !== 'string') throw new Error(`not an Fn::Sub: ${JSON.stringify(value)}`);
  const pseudo: Record<string, string> = {
    'AWS::Partition': 'aws',
    'AWS::Region': 'eu-west-1',
    'AWS::AccountId': '123456789012',
  };
  return text.replace(/\$\{(AWS::\w+)\}/g, (whole, name: string) => pseudo[name] ?? whole);
}

// ---------------------------------------------------------------------------------------------

describe('the database password', () => {
  it('is in no function’s environment: only the name of its SecureString parameter is', () => {
    for (const key of FUNCTION_KEYS) {
      const env = environmentOf(key);
      expect(env.DATABASE_URL_PARAMETER, key).toBe(DATABASE_URL_PARAMETER);
      expect(env, key).not.toHaveProperty('DATABASE_URL');
      for (const [name, value] of Object.entries(env)) {
        const where = `${key} ${name}`;
        expect(value, where).not.toMatch(/postgres(ql)?:\/\//i);
        expect(value, where).not.toMatch(/[a-z][a-z0-9+.-]*:\/\/[^/\s@]*:[^/\s@]*@/i);
        expect(value, where).not.toContain('resolve:ssm-secure');
        expect(value, where).not.toContain('database-url}}');
      }
    }
  });

  it('is readable by each function through exactly one parameter and one key, decrypted only through SSM', () => {
    const parameterArn = `arn:aws:ssm:eu-west-1:123456789012:parameter${DATABASE_URL_PARAMETER}`;
    for (const key of FUNCTION_KEYS) {
      const statements = statementsOf(key);
      const ssm = statements.filter((s) => asList(s.Action).some((action) => action.startsWith('ssm:')));
      expect(ssm, key).toHaveLength(1);
      expect(asList(ssm[0]!.Action), key).toEqual(['ssm:GetParameter']);
      expect(asList(ssm[0]!.Resource).map(substituted), key).toEqual([parameterArn]);
      expect(ssm[0]!.Condition, key).toBeUndefined();

      const kms = statements.filter((s) => asList(s.Action).some((action) => action.startsWith('kms:')));
      expect(kms, key).toHaveLength(1);
      expect(asList(kms[0]!.Action), key).toEqual(['kms:Decrypt']);
      expect(asList(kms[0]!.Resource).map(referencedLogicalId), key).toEqual(['DatabaseUrlKey']);
      const conditions = kms[0]!.Condition?.StringEquals ?? {};
      expect(substituted(conditions['kms:ViaService']), key).toBe('ssm.eu-west-1.amazonaws.com');
      expect(substituted(conditions['kms:EncryptionContext:PARAMETER_ARN']), key).toBe(parameterArn);
    }
  });

  it('is encrypted with the stage’s own rotating key, kept when the stack goes, administered by IAM only', () => {
    const key = template.Resources.DatabaseUrlKey!;
    expect(key.Type).toBe('AWS::KMS::Key');
    expect(key).toMatchObject({ DeletionPolicy: 'Retain', UpdateReplacePolicy: 'Retain' });
    expect(key.Properties?.EnableKeyRotation).toBe(true);
    const policy = key.Properties?.KeyPolicy as { Statement: Statement[] };
    expect(policy.Statement).toHaveLength(1);
    expect(
      substituted((policy.Statement[0] as unknown as { Principal: { AWS: unknown } }).Principal.AWS),
    ).toBe('arn:aws:iam::123456789012:root');
    const alias = resourcesOfType(template, 'AWS::KMS::Alias')[0]![1].Properties!;
    expect(alias.AliasName).toBe(`alias/runtime-cleanup-${STAGE}-database-url`);
    expect(referencedLogicalId(alias.TargetKeyId)).toBe('DatabaseUrlKey');
    expect(template.Outputs?.DatabaseUrlParameterName?.Value).toBe(DATABASE_URL_PARAMETER);
  });
});

describe('each function carries only what it uses', () => {
  it('gives SANDBOX_PROVISIONER_URL to the release function and the reclaimer alone', () => {
    for (const key of FUNCTION_KEYS) {
      const env = environmentOf(key);
      if (CALLS_PROVISIONER.has(key)) {
        expect(env.SANDBOX_PROVISIONER_URL).toBe(`{{resolve:ssm:${PROVISIONER_URL_PARAMETER}}}`);
      } else {
        expect(env, key).not.toHaveProperty('SANDBOX_PROVISIONER_URL');
      }
    }
  });

  it('bundles no local-only code, and the provisioner client into release and the reclaimer alone', () => {
    const devDependencies = Object.keys(
      (createRequire(import.meta.url)('../../package.json') as { devDependencies: Record<string, string> })
        .devDependencies,
    );
    for (const key of FUNCTION_KEYS) {
      // esbuild (not minified) marks where each module starts: `// <path of the source file>`.
      const modules = [...bundles.get(key)!.matchAll(/^\/\/ (\S+\.(?:[cm]?[jt]s|json))$/gm)].map(
        (match) => match[1]!,
      );
      expect(modules.length, `${key}: the scan sees the bundle's modules`).toBeGreaterThan(20);
      const own = modules.filter((path) => !path.startsWith('node_modules/'));
      expect(
        own.filter((path) => !path.startsWith('functions/') && path !== 'infra/queues.json'),
        key,
      ).toEqual([]);
      const packages = new Set(
        modules
          .filter((path) => path.startsWith('node_modules/'))
          .map((path) =>
            path
              .split('/')
              .slice(1, path.startsWith('node_modules/@') ? 3 : 2)
              .join('/'),
          ),
      );
      expect(
        devDependencies.filter((name) => packages.has(name)),
        key,
      ).toEqual([]);
      const carriesProvisioner = own.includes('functions/adapters/provisioner-client.ts');
      expect(carriesProvisioner, key).toBe(CALLS_PROVISIONER.has(key));
      expect(own.includes('functions/cleanup/sandbox-provider.ts'), key).toBe(CALLS_PROVISIONER.has(key));
      expect(packages.has('undici'), key).toBe(CALLS_PROVISIONER.has(key));
    }
  });
});

describe('bundle size', () => {
  /** Bytes of a bundle that come from one package, by esbuild's `// <source path>` markers. */
  function bytesFrom(bundle: string, packageName: string): number {
    const marks = [...bundle.matchAll(/^\/\/ (\S+\.(?:[cm]?[jt]s|json))$/gm)];
    let bytes = 0;
    marks.forEach((mark, index) => {
      if (!mark[1]!.startsWith(`node_modules/${packageName}/`)) return;
      const end = marks[index + 1]?.index ?? bundle.length;
      bytes += Buffer.byteLength(bundle.slice(mark.index, end));
    });
    return bytes;
  }

  it('carries zod’s tree-shaken mini build: under 150 KB of each bundle (the classic build was 786 KB of every one)', () => {
    for (const key of FUNCTION_KEYS) {
      const zod = bytesFrom(bundles.get(key)!, 'zod');
      expect(zod, key).toBeGreaterThan(0);
      expect(zod, key).toBeLessThan(150_000);
    }
  });
});

describe('the connection budget', () => {
  it('bounds every function’s concurrency, from infra/queues.json', () => {
    for (const key of ['fenceCheck', 'release', 'finalize'] as const) {
      const scaling = mappingOf(key)?.ScalingConfig as { MaximumConcurrency?: number } | undefined;
      expect(scaling?.MaximumConcurrency, key).toBe(FUNCTION_DEFINITIONS[key].maximumConcurrency);
    }
    expect(lambdaFunction('sweeper').properties.ReservedConcurrentExecutions).toBe(
      FUNCTION_DEFINITIONS.sweeper.reservedConcurrency,
    );
    expect(lambdaFunction('reclaimer').properties.ReservedConcurrentExecutions).toBe(
      FUNCTION_DEFINITIONS.reclaimer.reservedConcurrency,
    );
  });

  it('keeps the sum of concurrency × pool size within DATABASE_MAX_CONNECTIONS', () => {
    const max = Number(environmentOf('fenceCheck').DATABASE_MAX_CONNECTIONS);
    expect(max).toBe(CONFIG_DEFAULTS.DATABASE_MAX_CONNECTIONS);
    let total = 0;
    for (const key of FUNCTION_KEYS) {
      expect(Number(environmentOf(key).DATABASE_MAX_CONNECTIONS), key).toBe(max);
      const scaling = mappingOf(key)?.ScalingConfig as { MaximumConcurrency?: number } | undefined;
      const concurrency =
        scaling?.MaximumConcurrency ??
        (lambdaFunction(key).properties.ReservedConcurrentExecutions as number);
      total += concurrency * FUNCTION_DEFINITIONS[key].databasePoolSize;
    }
    expect(total).toBe(connectionBudget(max).total);
    expect(total).toBeLessThanOrEqual(max);
  });

  it('is reported by `ops check-config`, which fails the same way', async () => {
    const ops = (env: Record<string, string>) =>
      runChild('npm', ['run', '--silent', 'ops', '--', 'check-config'], {
        cwd: PROJECT_ROOT,
        env: { PATH: process.env.PATH ?? '', HOME: home, ...env },
        timeoutMs: 60_000,
      });
    const total = connectionBudget(CONFIG_DEFAULTS.DATABASE_MAX_CONNECTIONS).total;
    const fits = await ops({});
    expect(fits.code, fits.stderr).toBe(0);
    expect(fits.stdout).toContain(
      `Database connections: ${total} at most, within DATABASE_MAX_CONNECTIONS ${CONFIG_DEFAULTS.DATABASE_MAX_CONNECTIONS}`,
    );
    expect(fits.stdout).toMatch(/fenceCheck\s+3 \(maximumConcurrency\)\s+4\s+12/);
    const over = await ops({ DATABASE_MAX_CONNECTIONS: String(total - 1) });
    expect(over.code).toBe(2);
    expect(over.stderr).toContain(`DATABASE_MAX_CONNECTIONS="${total - 1}" is invalid`);
  });
});

describe('loops, retries and what a stack delete keeps', () => {
  it('allows the recursive loops fence-check and finalize run by design, and stops any other', () => {
    // Why: serverless.yml, and test/integration/deferral-chain.test.ts for the chain lengths.
    expect(lambdaFunction('fenceCheck').properties.RecursiveLoop).toBe('Allow');
    expect(lambdaFunction('finalize').properties.RecursiveLoop).toBe('Allow');
    expect(lambdaFunction('release').properties.RecursiveLoop).toBe('Terminate');
    expect(lambdaFunction('sweeper').properties.RecursiveLoop).toBe('Terminate');
    expect(lambdaFunction('reclaimer').properties.RecursiveLoop).toBe('Terminate');
  });

  it('never retries a reclaim run (the next run is the retry) nor runs one older than an interval', () => {
    const reclaimerId = lambdaFunction('reclaimer').id;
    const configs = resourcesOfType(template, 'AWS::Lambda::EventInvokeConfig').filter(
      ([, config]) => referencedLogicalId(config.Properties?.FunctionName) === reclaimerId,
    );
    expect(configs).toHaveLength(1);
    expect(configs[0]![1].Properties).toMatchObject({
      MaximumRetryAttempts: 0,
      MaximumEventAgeInSeconds: Math.max(60, CONFIG_DEFAULTS.RECLAIM_INTERVAL_SECONDS),
    });
  });

  it('never retries a sweeper tick (the next tick is the retry) nor runs a tick older than an interval', () => {
    const sweeperId = lambdaFunction('sweeper').id;
    const configs = resourcesOfType(template, 'AWS::Lambda::EventInvokeConfig').filter(
      ([, config]) => referencedLogicalId(config.Properties?.FunctionName) === sweeperId,
    );
    expect(configs).toHaveLength(1);
    expect(configs[0]![1].Properties).toMatchObject({
      MaximumRetryAttempts: 0,
      MaximumEventAgeInSeconds: Math.max(60, CONFIG_DEFAULTS.FENCE_SWEEP_INTERVAL_SECONDS),
    });
  });

  it('keeps every dead-letter queue, and its dead letters, through a stack delete or a replacement', () => {
    for (const [queue, definition] of Object.entries(QUEUE_DEFINITIONS)) {
      if (!definition.consumer) continue;
      const [, dlq] = queueByName(deadLetterQueueName(queue));
      expect(dlq, queue).toMatchObject({ DeletionPolicy: 'Retain', UpdateReplacePolicy: 'Retain' });
    }
  });
});

describe('alarms that reach a person', () => {
  it('subscribe the email address or HTTPS endpoint given at deploy time to the alarm topic', () => {
    const subscriptions = resourcesOfType(template, 'AWS::SNS::Subscription');
    expect(subscriptions).toHaveLength(1);
    const properties = subscriptions[0]![1].Properties!;
    expect(properties).toMatchObject({ Protocol: 'email', Endpoint: PRODUCTION_ALARM_SUBSCRIPTION });
    expect(referencedLogicalId(properties.TopicArn)).toBe('AlarmTopic');
  });

  it('accept only an email address or an https:// URL as the subscription, and none at all', async () => {
    const { subscriptionOf } = createRequire(import.meta.url)('../../infra/serverless/alarms.cjs') as {
      subscriptionOf: (value: string | undefined) => { Protocol: string; Endpoint: string } | undefined;
    };
    expect(subscriptionOf('')).toBeUndefined();
    expect(subscriptionOf(undefined)).toBeUndefined();
    expect(subscriptionOf('https://hooks.example.com/alarms?token=x')).toEqual({
      Protocol: 'https',
      Endpoint: 'https://hooks.example.com/alarms?token=x',
    });
    for (const bad of ['http://hooks.example.com/alarms', 'oncall', 'ftp://x.example.com']) {
      expect(() => subscriptionOf(bad), bad).toThrow(/must be an email address or an https:\/\/ URL/);
    }
    const refused = await runPackage(
      [
        '--stage',
        STAGE,
        '--package',
        join(workDir, 'bad-subscription'),
        '--param',
        'alarmSubscription=oncall',
      ],
      { home },
    );
    expect(refused.code).not.toBe(0);
    expect(refused.output).toContain(
      'alarmSubscription "oncall" must be an email address or an https:// URL',
    );
  });

  it('page on each function’s errors and throttles, and on the oldest message of every consumed queue', () => {
    for (const key of FUNCTION_KEYS) {
      for (const metric of ['Errors', 'Throttles']) {
        const alarm = lambdaAlarm(metric, key);
        expect(alarm, `${key} ${metric}`).toMatchObject({
          Statistic: 'Sum',
          Threshold: 0,
          ComparisonOperator: 'GreaterThanThreshold',
        });
        expect((alarm!.AlarmActions as unknown[]).map(referencedLogicalId)).toEqual(['AlarmTopic']);
      }
    }
    for (const [queue, definition] of Object.entries(QUEUE_DEFINITIONS)) {
      if (!definition.consumer) continue;
      const [queueId] = queueByName(queue);
      const alarm = alarms().find(
        ([, candidate]) =>
          candidate.MetricName === 'ApproximateAgeOfOldestMessage' &&
          referencedLogicalId((candidate.Dimensions as Array<{ Value: unknown }>)[0]?.Value) === queueId,
      )?.[1];
      expect(alarm, queue).toBeDefined();
      // Older than every allowed attempt could take: not merely slow, stuck.
      const consumer = FUNCTION_DEFINITIONS[definition.consumer as FunctionKey];
      expect(Number(alarm!.Threshold), queue).toBeGreaterThan(
        consumer.timeoutSeconds * (definition.maxReceiveCount ?? 1),
      );
    }
  });

  it('graph ForcedClears with the dimensions the deployed sweeper emits it with', () => {
    const [[, dashboard] = []] = resourcesOfType(template, 'AWS::CloudWatch::Dashboard');
    const body = substituteForInspection(dashboard!.Properties?.DashboardBody);
    const search = body.match(/SEARCH\('\{([^}]+)\} MetricName=\\"ForcedClears\\"/);
    expect(search?.[1]?.split(',')).toEqual([METRICS_NAMESPACE, 'function', 'service', 'stage']);
  });
});
