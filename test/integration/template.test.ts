/**
 * The deployable artifact, as CloudFormation and Lambda receive it: `npm run package` runs once,
 * offline and without any AWS configuration, and every claim below reads the generated template
 * or the zips. The expected names come from the contract, not from the generator. No database is
 * involved, so it runs once, not per database pass: the handlers of these zips run against one in
 * packaged-bundles.test.ts.
 */
import { readFile, rm } from 'node:fs/promises';
import { isBuiltin } from 'node:module';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONFIG_DEFAULTS, DATABASE_FAILURE_REPORT_MARGIN_MS } from '../../functions/adapters/config.ts';
import { METRICS_NAMESPACE, MetricName } from '../../functions/adapters/metric-names.ts';
import {
  deadLetterQueueName,
  FUNCTION_DEFINITIONS,
  QUEUE_DEFINITIONS,
} from '../../functions/adapters/queues.ts';
import { PUBLISH_MARGIN_MS } from '../../functions/release/handler.ts';
import {
  FUNCTION_KEYS,
  type FunctionKey,
  HANDLER_PATHS,
  runInTask,
  unpackForLambda,
  withPlainDatabaseUrl,
} from '../support/lambda-task.ts';
import {
  type CfnTemplate,
  packageService,
  packagingWorkDir,
  readZip,
  referencedLogicalId,
  referencedLogicalIds,
  resourcesOfType,
  runPackage,
} from '../support/packaged-template.ts';
import { asList, TemplateQueries } from '../support/template-queries.ts';

const STAGE = 'ci';
const PREFIX = `${STAGE}-`;

/** docs/integration.md, section 2: base names, FIFO-ness, and the DLQ of each consumed queue. */
const CONTRACT_QUEUES = {
  'run-finished': { fifo: false, dlq: 'run-finished-dlq' },
  'runtime-release.fifo': { fifo: true, dlq: 'runtime-release-dlq.fifo' },
  'runtime-finalize': { fifo: false, dlq: 'runtime-finalize-dlq' },
  'runtime-cleaned': { fifo: false, dlq: null },
} as const;

/** Who consumes what and may send where: the protocol's arrows, DLQ moves included. */
const EXPECTED_GRANTS: Record<FunctionKey, { consumes: string[]; sendsTo: string[] }> = {
  fenceCheck: {
    consumes: ['run-finished'],
    sendsTo: ['run-finished', 'run-finished-dlq', 'runtime-finalize', 'runtime-release.fifo'],
  },
  release: {
    consumes: ['runtime-release.fifo'],
    sendsTo: ['run-finished', 'runtime-finalize', 'runtime-release-dlq.fifo'],
  },
  finalize: {
    consumes: ['runtime-finalize'],
    sendsTo: ['run-finished', 'runtime-cleaned', 'runtime-finalize', 'runtime-finalize-dlq'],
  },
  sweeper: { consumes: [], sendsTo: ['run-finished'] },
  // Lists and deletes at the provisioner; no queue at all.
  reclaimer: { consumes: [], sendsTo: [] },
};

/**
 * docs/integration.md, section 4, as every function carries it. AWS_ENDPOINT_URL_SQS is deliberately left
 * unset (unset = real SQS); DATABASE_URL is read from SSM at cold start and SANDBOX_PROVISIONER_URL
 * is the release function's alone (template-production.test.ts).
 */
const CONTRACT_VARIABLES = [
  'SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS',
  'SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS',
  'SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS',
  'CLEANUP_RETRY_BASE_SECONDS',
  'CLEANUP_RETRY_MAX_SECONDS',
  'FENCE_SWEEP_AFTER_SECONDS',
  'FENCE_SWEEP_INTERVAL_SECONDS',
];

/**
 * Optional dependencies required inside try/catch and absent here and in Lambda: ws's speed-ups
 * (it falls back to plain JavaScript), and node-postgres's native binding, reached only through
 * `pg.native`, which nothing here reads (excluded in serverless.yml).
 */
const OPTIONAL_REQUIRES = new Set(['bufferutil', 'utf-8-validate', 'pg-native']);

let workDir: string;
let template: CfnTemplate;
/** The template's questions (template-queries.ts), asked of this run's template. */
let cfn: TemplateQueries<FunctionKey>;
let artifacts: Map<string, string>;
let packageOutput: string;
/** Function key → the directory its zip was unpacked into, laid out like Lambda's /var/task. */
const taskDirs = new Map<FunctionKey, string>();

beforeAll(async () => {
  let home: string;
  ({ workDir, home } = await packagingWorkDir('package'));
  // Packaged once per run: template-stage-settings.test.ts compares its own packagings with it.
  const packaged = await packageService({
    stage: STAGE,
    outputDir: join(workDir, 'package'),
    home,
    oncePerRun: true,
  });
  template = packaged.template;
  cfn = new TemplateQueries(template, {
    service: 'runtime-cleanup',
    stage: STAGE,
    functionKeys: FUNCTION_KEYS,
  });
  artifacts = packaged.artifacts;
  packageOutput = packaged.output;
  for (const key of FUNCTION_KEYS) {
    const task = join(workDir, 'task', key);
    await unpackForLambda(artifacts.get(key)!, task);
    taskDirs.set(key, task);
  }
  // Packaging waits its turn behind the other packaging files (PACKAGE_LOCK_WAIT_MS), then packages.
}, 330_000);

afterAll(async () => {
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

// ---------------------------------------------------------------------------------------------

describe('npm run package', () => {
  it('packages offline with no AWS configuration and reports the stage it packaged', () => {
    expect(packageOutput).toContain(`Packaging runtime-cleanup for stage ${STAGE}`);
    expect(packageOutput).toMatch(/Service packaged/);
    expect([...artifacts.keys()].sort()).toEqual([...FUNCTION_KEYS].sort());
  });

  it('zips only each function’s bundle: no node_modules, no .data, no sources', async () => {
    for (const key of FUNCTION_KEYS) {
      const entries = [...(await readZip(artifacts.get(key)!)).keys()];
      expect(entries, key).toEqual([HANDLER_PATHS[key]]);
    }
  });

  // One refusal of the timeout ladder through the real `npm run package`: its rules, the connection
  // budget's too, are held on the function that decides them (test/unit/timeout-ladder.test.ts). A
  // configuration value's own rule (config.ts) is held on settingsOf (test/unit/stage-settings.test.ts);
  // its refusal reaches osls from the same settingsOf call as the param refusal
  // template-stage-settings.test.ts packages.
  it('refuses to package a release timeout that does not outlive SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS', async () => {
    const run = await runPackage(
      [
        '--stage',
        STAGE,
        '--package',
        join(workDir, 'refused'),
        '--param',
        `SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS=${FUNCTION_DEFINITIONS.release.timeoutSeconds}`,
      ],
      { home: join(workDir, 'home') },
    );
    expect(run.code).not.toBe(0);
    expect(run.output).toContain(
      `functions.release.timeoutSeconds (${FUNCTION_DEFINITIONS.release.timeoutSeconds}) must be at least SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS`,
    );
  });
});

describe('functions', () => {
  it('run on nodejs22.x with the timeouts of infra/queues.json', () => {
    for (const key of FUNCTION_KEYS) {
      const { properties } = cfn.lambdaFunction(key);
      expect(properties.Runtime, key).toBe('nodejs22.x');
      expect(properties.Timeout, key).toBe(FUNCTION_DEFINITIONS[key].timeoutSeconds);
      expect(properties.Handler, key).toBe(HANDLER_PATHS[key].replace(/\.mjs$/, '.handler'));
    }
  });

  it('carry every contract variable, the database URL as the name of its SSM parameter', () => {
    for (const key of FUNCTION_KEYS) {
      const env = cfn.environmentOf(key);
      for (const name of CONTRACT_VARIABLES) expect(env[name], `${key} ${name}`).toBeTruthy();
      expect(env).not.toHaveProperty('DATABASE_URL');
      expect(env.DATABASE_URL_PARAMETER).toBe('/runtime-cleanup/ci/database-url');
      expect(env).not.toHaveProperty('AWS_ENDPOINT_URL_SQS');
      expect(env).toMatchObject({
        STAGE,
        QUEUE_NAME_PREFIX: PREFIX,
        POWERTOOLS_SERVICE_NAME: 'runtime-cleanup',
        POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
        LOG_LEVEL: 'INFO',
      });
      for (const [name, value] of Object.entries(CONFIG_DEFAULTS))
        expect(env[name], name).toBe(String(value));
    }
  });
});

describe('timeout ladder', () => {
  it('gives release more time than SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS plus its publish margin', () => {
    const cleanupTimeout = Number(cfn.environmentOf('release').SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS);
    expect(cleanupTimeout).toBe(155);
    expect(cfn.lambdaFunction('release').properties.Timeout).toBeGreaterThanOrEqual(
      cleanupTimeout + PUBLISH_MARGIN_MS / 1000,
    );
  });

  it('lets a database that never answers fail one record before each consumer’s deadline', () => {
    for (const { functionKey } of cfn.eventSourceMappings()) {
      const environment = cfn.environmentOf(functionKey);
      const boundSeconds =
        (Number(environment.DATABASE_CONNECT_TIMEOUT_MS) +
          Number(environment.DATABASE_QUERY_TIMEOUT_MS) +
          DATABASE_FAILURE_REPORT_MARGIN_MS) /
        1000;
      expect(boundSeconds, functionKey).toBeGreaterThan(DATABASE_FAILURE_REPORT_MARGIN_MS / 1000);
      expect(Number(cfn.lambdaFunction(functionKey).properties.Timeout), functionKey).toBeGreaterThanOrEqual(
        boundSeconds,
      );
    }
  });

  it('keeps each consumed queue invisible for at least 6 times its consumer’s timeout', () => {
    const mappings = cfn.eventSourceMappings();
    expect(mappings).toHaveLength(3);
    for (const { functionKey, queue } of mappings) {
      const visibility = Number(cfn.props(cfn.queueLogicalIdByBaseName(queue)).VisibilityTimeout);
      const timeout = Number(cfn.lambdaFunction(functionKey).properties.Timeout);
      expect(visibility, queue).toBeGreaterThanOrEqual(6 * timeout);
    }
  });

  it('dead-letters only after at least 5 receives', () => {
    for (const [base, { dlq }] of Object.entries(CONTRACT_QUEUES)) {
      if (!dlq) continue;
      const redrive = cfn.props(cfn.queueLogicalIdByBaseName(base)).RedrivePolicy as {
        maxReceiveCount: number;
      };
      expect(redrive.maxReceiveCount, base).toBeGreaterThanOrEqual(5);
      expect(redrive.maxReceiveCount, base).toBe(
        QUEUE_DEFINITIONS[base as keyof typeof QUEUE_DEFINITIONS].maxReceiveCount,
      );
    }
  });
});

describe('event sources', () => {
  it('connect each function to its contract queue and report batch item failures', () => {
    const mappings = cfn.eventSourceMappings().map(({ functionKey, queue, properties }) => ({
      functionKey,
      queue,
      responseTypes: properties.FunctionResponseTypes,
    }));
    expect(mappings.sort((a, b) => a.queue.localeCompare(b.queue))).toEqual([
      { functionKey: 'fenceCheck', queue: 'run-finished', responseTypes: ['ReportBatchItemFailures'] },
      { functionKey: 'finalize', queue: 'runtime-finalize', responseTypes: ['ReportBatchItemFailures'] },
      { functionKey: 'release', queue: 'runtime-release.fifo', responseTypes: ['ReportBatchItemFailures'] },
    ]);
  });

  it('take batch size, batching window and maximum concurrency from infra/queues.json', () => {
    for (const { functionKey, queue, properties } of cfn.eventSourceMappings()) {
      const settings: {
        timeoutSeconds: number;
        batchSize?: number;
        maximumBatchingWindowInSeconds?: number;
        maximumConcurrency?: number;
      } = FUNCTION_DEFINITIONS[functionKey];
      expect(properties.BatchSize, functionKey).toBe(settings.batchSize);
      if (CONTRACT_QUEUES[queue as keyof typeof CONTRACT_QUEUES].fifo) {
        // Lambda rejects a batching window on a FIFO source.
        expect(properties.MaximumBatchingWindowInSeconds ?? 0, functionKey).toBe(0);
      } else {
        expect(properties.MaximumBatchingWindowInSeconds, functionKey).toBe(
          settings.maximumBatchingWindowInSeconds,
        );
      }
      const scaling = properties.ScalingConfig as { MaximumConcurrency?: number } | undefined;
      expect(scaling?.MaximumConcurrency, functionKey).toBe(settings.maximumConcurrency);
    }
    expect(FUNCTION_DEFINITIONS.release.maximumConcurrency).toBeGreaterThan(0);
  });

  it('runs the sweeper on the FENCE_SWEEP_INTERVAL_SECONDS schedule and the reclaimer on RECLAIM_INTERVAL_SECONDS', () => {
    const rules = resourcesOfType(template, 'AWS::Events::Rule');
    expect(rules).toHaveLength(2);
    const scheduled = Object.fromEntries(
      rules.map(([, rule]) => {
        const targets = rule.Properties!.Targets as Array<{ Arn: unknown }>;
        expect(targets).toHaveLength(1);
        return [
          cfn.functionKeyOf(referencedLogicalId(targets[0]!.Arn)!),
          rule.Properties!.ScheduleExpression,
        ];
      }),
    );
    expect(scheduled).toEqual({ sweeper: 'rate(1 minute)', reclaimer: 'rate(5 minutes)' });
  });
});

describe('queues', () => {
  it('are exactly the contract’s queues and dead-letter queues, with the stage prefix', () => {
    const names = resourcesOfType(template, 'AWS::SQS::Queue').map(([, queue]) =>
      String(queue.Properties?.QueueName),
    );
    const expected = Object.entries(CONTRACT_QUEUES).flatMap(([base, { dlq }]) =>
      dlq ? [base, dlq] : [base],
    );
    expect(names.sort()).toEqual(expected.map((name) => `${PREFIX}${name}`).sort());
    for (const [base, { dlq }] of Object.entries(CONTRACT_QUEUES)) {
      if (dlq) expect(deadLetterQueueName(base)).toBe(dlq);
    }
  });

  it('are FIFO exactly where the contract says, with sender-chosen deduplication and high throughput', () => {
    for (const [base, { fifo, dlq }] of Object.entries(CONTRACT_QUEUES)) {
      for (const name of dlq ? [base, dlq] : [base]) {
        const queue = cfn.props(cfn.queueLogicalIdByBaseName(name));
        expect(queue.FifoQueue ?? false, name).toBe(fifo);
        if (fifo) expect(queue.ContentBasedDeduplication, name).toBe(false);
        // High-throughput FIFO (docs/capacity.md): per-group quotas, no queue-wide 300 calls/s.
        if (fifo) expect(queue.DeduplicationScope, name).toBe('messageGroup');
        if (fifo) expect(queue.FifoThroughputLimit, name).toBe('perMessageGroupId');
      }
    }
  });

  it('redrive each consumed queue into its own contract-named DLQ, and take attributes from queues.json', () => {
    for (const [base, { dlq }] of Object.entries(CONTRACT_QUEUES)) {
      const queue = cfn.props(cfn.queueLogicalIdByBaseName(base));
      const definition = QUEUE_DEFINITIONS[base as keyof typeof QUEUE_DEFINITIONS];
      expect(queue.VisibilityTimeout, base).toBe(definition.visibilityTimeoutSeconds);
      expect(queue.MessageRetentionPeriod, base).toBe(definition.messageRetentionSeconds);
      const redrive = queue.RedrivePolicy as { deadLetterTargetArn: unknown } | undefined;
      if (!dlq) {
        expect(redrive, base).toBeUndefined();
        continue;
      }
      expect(cfn.queueBaseName(referencedLogicalId(redrive?.deadLetterTargetArn)!), base).toBe(dlq);
    }
  });
});

describe('least privilege', () => {
  it('gives every function its own role and creates no shared service role', () => {
    const roles = resourcesOfType(template, 'AWS::IAM::Role').map(([id]) => id);
    const used = FUNCTION_KEYS.map((key) => referencedLogicalId(cfn.lambdaFunction(key).properties.Role));
    expect(new Set(used).size).toBe(FUNCTION_KEYS.length);
    expect(roles.sort()).toEqual([...used].sort());
    expect(template.Resources).not.toHaveProperty('IamRoleLambdaExecution');
  });

  it('allows no wildcard action and no wildcard resource in any statement', () => {
    for (const [roleId] of resourcesOfType(template, 'AWS::IAM::Role')) {
      for (const statement of cfn.roleStatements(roleId)) {
        for (const action of asList(statement.Action)) expect(action, roleId).not.toMatch(/\*/);
        for (const target of asList(statement.Resource)) {
          expect(typeof target, `${roleId}: resources are references, not strings`).toBe('object');
          expect(JSON.stringify(target), roleId).not.toContain('*');
        }
      }
    }
  });

  it('lets each function consume only its own queue and send only along the protocol’s arrows', () => {
    for (const key of FUNCTION_KEYS) {
      const expected = EXPECTED_GRANTS[key];
      for (const action of ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:ChangeMessageVisibility']) {
        expect(cfn.queuesAllowed(key, action), `${key} ${action}`).toEqual([...expected.consumes]);
      }
      expect(cfn.queuesAllowed(key, 'sqs:SendMessage'), key).toEqual([...expected.sendsTo]);
      expect(cfn.queuesAllowed(key, 'sqs:GetQueueUrl'), key).toEqual(
        [...new Set([...expected.consumes, ...expected.sendsTo])].sort(),
      );
    }
  });

  it('grants nothing beyond SQS, writing its own log group and reading the database URL (metrics go out as EMF logs)', () => {
    for (const key of FUNCTION_KEYS) {
      const { id, properties } = cfn.lambdaFunction(key);
      const statements = cfn.roleStatements(referencedLogicalId(properties.Role)!);
      const actions = new Set(statements.flatMap((statement) => asList(statement.Action)));
      expect([...actions].filter((action) => !action.startsWith('sqs:')).sort(), key).toEqual([
        'kms:Decrypt',
        'logs:CreateLogStream',
        'logs:PutLogEvents',
        'ssm:GetParameter',
      ]);
      const logStatements = statements.filter((statement) =>
        asList(statement.Action).includes('logs:PutLogEvents'),
      );
      const logGroups = logStatements.flatMap((statement) =>
        asList(statement.Resource).map(referencedLogicalId),
      );
      const dependsOn = asList(cfn.resource(id).DependsOn ?? []);
      expect(logGroups).toHaveLength(1);
      expect(cfn.resource(logGroups[0]!).Type).toBe('AWS::Logs::LogGroup');
      expect(dependsOn, key).toContain(logGroups[0]);
    }
  });
});

describe('alarms', () => {
  it('page on any message in any dead-letter queue', () => {
    for (const { dlq } of Object.values(CONTRACT_QUEUES)) {
      if (!dlq) continue;
      const alarm = cfn.alarmOnQueue('ApproximateNumberOfMessagesVisible', dlq);
      expect(alarm, dlq).toMatchObject({ Threshold: 0, ComparisonOperator: 'GreaterThanThreshold' });
    }
  });

  it('watch the oldest pending fence, the release failures and the age of the oldest release command', () => {
    const watched = cfn.alarms().flatMap(([, alarm]) => cfn.customMetricsOfAlarm(alarm));
    expect(watched).toContain(MetricName.OLDEST_FENCE_AGE);
    expect(watched).toContain(MetricName.RELEASE_FAILED);
    expect(cfn.alarmOnQueue('ApproximateAgeOfOldestMessage', 'runtime-release.fifo')).toBeDefined();
  });

  it('page at the first DELETE refused because SANDBOX_PROVISIONER_URL is not the provisioner, from either function', () => {
    const [, alarm] =
      cfn
        .alarms()
        .find(([, candidate]) =>
          cfn.customMetricsOfAlarm(candidate).includes(MetricName.PROVISIONER_URL_UNVERIFIED),
        ) ?? [];
    expect(alarm).toMatchObject({
      Threshold: 0,
      ComparisonOperator: 'GreaterThanThreshold',
      EvaluationPeriods: 1,
    });
    // Summed over every function that emits it (release and reclaimer), not one series.
    const [query] = alarm!.Metrics as Array<{ Expression: string }>;
    expect(query!.Expression).not.toContain('function');
  });

  it('page when reclaim runs are refused and when a leak outlives its grace by three intervals', () => {
    const byMetric = new Map(
      cfn
        .alarms()
        .flatMap(([, alarm]) => cfn.customMetricsOfAlarm(alarm).map((metric) => [metric, alarm] as const)),
    );
    const reclaimer = [
      { Name: 'service', Value: 'runtime-cleanup' },
      { Name: 'stage', Value: STAGE },
      { Name: 'function', Value: 'reclaimer' },
    ];
    // The exact dimension set the handler emits the aggregate with (no `reason`).
    expect(byMetric.get(MetricName.RECLAIM_REFUSED)).toMatchObject({ Dimensions: reclaimer, Threshold: 0 });
    expect(byMetric.get(MetricName.OLDEST_LEAK_AGE)).toMatchObject({
      Dimensions: reclaimer,
      Threshold: CONFIG_DEFAULTS.RECLAIM_GRACE_SECONDS + 3 * CONFIG_DEFAULTS.RECLAIM_INTERVAL_SECONDS,
      // A reclaimer that stopped reporting is a fault too.
      TreatMissingData: 'breaching',
    });
  });

  it('refer only to metric names of metric-names.ts', () => {
    const known = new Set<string>(Object.values(MetricName));
    for (const [id, alarm] of cfn.alarms()) {
      for (const metric of cfn.customMetricsOfAlarm(alarm))
        expect(known.has(metric), `${id}: ${metric}`).toBe(true);
    }
  });

  it('say what they mean and what to do, and notify the alarm topic', () => {
    const topics = resourcesOfType(template, 'AWS::SNS::Topic').map(([id]) => id);
    expect(cfn.alarms().length).toBeGreaterThanOrEqual(6);
    for (const [id, alarm] of cfn.alarms()) {
      const description = String(alarm.AlarmDescription ?? '');
      expect(description, id).toMatch(/^Means: \S.{20,} Do: \S.{20,}$/s);
      expect(description.length, id).toBeLessThanOrEqual(1024);
      const actions = (alarm.AlarmActions ?? []) as unknown[];
      expect(actions.map(referencedLogicalId), id).toEqual(topics);
    }
  });
});

describe('dashboard', () => {
  it('graphs every metric of metric-names.ts and no other custom metric', () => {
    const graphed = new Set(cfn.dashboardCustomMetrics().map(({ metric }) => metric));
    expect([...graphed].sort()).toEqual(Object.values(MetricName).sort());
  });

  it('shows the depth of every queue and dead-letter queue, and every alarm', () => {
    const depth = cfn
      .dashboardWidgets()
      .flatMap((widget) => widget.properties.metrics ?? [])
      .filter((line) => line[0] === 'AWS/SQS' && line[1] === 'ApproximateNumberOfMessagesVisible')
      .map((line) => cfn.queueBaseName(String(line[3]).replace(/^<(\w+)\.QueueName>$/, '$1')));
    const expected = Object.entries(CONTRACT_QUEUES).flatMap(([base, { dlq }]) =>
      dlq ? [base, dlq] : [base],
    );
    expect(depth.sort()).toEqual(expected.sort());
    const alarmWidget = cfn.dashboardWidgets().find((widget) => widget.type === 'alarm');
    expect(alarmWidget?.properties.alarms?.map((arn) => arn.replace(/^<(\w+)\.Arn>$/, '$1')).sort()).toEqual(
      cfn
        .alarms()
        .map(([id]) => id)
        .sort(),
    );
  });
});

describe('template integrity', () => {
  it('refers only to resources it defines (or to pseudo parameters)', () => {
    const missing = [...referencedLogicalIds(template)].filter(
      (id) => !id.startsWith('AWS::') && !(id in template.Resources),
    );
    expect(missing).toEqual([]);
  });
});

// ---------------------------------------------------------------------------------------------
// The bundles, run under the Node 22 that runs these tests

const IMPORT_PROBE = `
import net from 'node:net';
import { pathToFileURL } from 'node:url';
const connections = [];
const connect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function (...args) {
  connections.push(JSON.stringify(args[0]));
  return connect.apply(this, args);
};
const module = await import(pathToFileURL(process.env.BUNDLE).href);
// Let anything the import scheduled (a connect in a promise, a timer of 0) start.
await new Promise((resolve) => setImmediate(resolve));
await new Promise((resolve) => setTimeout(resolve, 0));
console.log(JSON.stringify({ exports: Object.keys(module), handler: typeof module.handler, connections }));
`;

describe('bundles', () => {
  it('load under Node 22 with only the runtime’s AWS SDK, export handler, and connect nowhere on import', async () => {
    const results = await Promise.all(
      FUNCTION_KEYS.map(async (key) => {
        const run = await runInTask(
          taskDirs.get(key)!,
          IMPORT_PROBE,
          withPlainDatabaseUrl(cfn.environmentOf(key), {
            BUNDLE: join(taskDirs.get(key)!, HANDLER_PATHS[key]),
          }),
        );
        return { key, run };
      }),
    );
    for (const { key, run } of results) {
      expect(run.code, `${key}: ${run.stderr}`).toBe(0);
      const report = JSON.parse(run.stdout.trim().split('\n').at(-1)!) as {
        exports: string[];
        handler: string;
        connections: string[];
      };
      expect(report.handler, key).toBe('function');
      expect(report.connections, key).toEqual([]);
    }
  });

  it('leave nothing to load at run time but Node built-ins and the AWS SDK', async () => {
    const { build } = await import('esbuild');
    const allowed = (specifier: string) =>
      isBuiltin(specifier) || specifier.startsWith('@aws-sdk/') || OPTIONAL_REQUIRES.has(specifier);
    for (const key of FUNCTION_KEYS) {
      const bundle = join(taskDirs.get(key)!, HANDLER_PATHS[key]);
      // ES imports, read by esbuild's own parser from the artifact.
      const analysis = await build({
        entryPoints: [bundle],
        bundle: true,
        write: false,
        metafile: true,
        platform: 'node',
        format: 'esm',
        packages: 'external',
        logLevel: 'silent',
      });
      const imports = Object.values(analysis.metafile.inputs).flatMap((input) =>
        input.imports.map((record) => record.path),
      );
      // require() calls esbuild left in: CommonJS dependencies call its `__require` shim.
      const code = await readFile(bundle, 'utf8');
      const shim = code.match(
        /([\w$]+)\s*=\s*(?:\/\*\s*@__PURE__\s*\*\/\s*)?\(\(?[\w$]+\)?\s*=>\s*typeof require\s*(?:<\s*"u"|!==\s*"undefined")\s*\?\s*require\s*:/,
      )?.[1];
      expect(shim, `${key}: esbuild's require shim`).toBeDefined();
      const calls = [
        ...code.matchAll(new RegExp(`(?<![\\w$.])${shim!.replaceAll('$', '\\$')}\\("([^"]+)"\\)`, 'g')),
      ].map((match) => match[1]!);
      expect(calls.length, key).toBeGreaterThan(0);
      expect(
        [...new Set([...imports, ...calls])].filter((specifier) => !allowed(specifier)),
        key,
      ).toEqual([]);
    }
  });
});
