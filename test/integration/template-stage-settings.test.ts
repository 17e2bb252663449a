/**
 * A stage's settings come from the repository (serverless.yml's params) or an explicit --param,
 * never from the packaging shell (infra/serverless/stage.cjs), and what they switch on is in the
 * template exactly: the private network with the network-interface permissions Lambda needs, the
 * provisioner token's parameter for the two functions that call the provisioner, DATABASE_DRIVER;
 * and, on every stage, the managed policy the agent platform attaches to its worker.
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONFIG_DEFAULTS } from '../../functions/adapters/config.ts';
import { MetricName } from '../../functions/adapters/metric-names.ts';
import { FUNCTION_KEYS, type FunctionKey } from '../support/lambda-task.ts';
import {
  type CfnTemplate,
  comparableTemplate,
  differingArtifacts,
  type PackagedService,
  packageService,
  packagingWorkDir,
  referencedLogicalId,
  resourcesOfType,
  runPackage,
} from '../support/packaged-template.ts';
import { asList, type Statement, TemplateQueries } from '../support/template-queries.ts';

const STAGE = 'ci';
const CALLS_PROVISIONER = new Set<FunctionKey>(['release', 'reclaimer']);

/**
 * A valid value for every tunable of config.ts, none of them its default: leaked from the shell,
 * each would change the template (the explicit packaging below shows they do).
 */
const CONFIGURED: Record<keyof typeof CONFIG_DEFAULTS, string> = {
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '20',
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '100',
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '150',
  CLEANUP_RETRY_BASE_SECONDS: '20',
  CLEANUP_RETRY_MAX_SECONDS: '1000',
  FENCE_SWEEP_AFTER_SECONDS: '20',
  FENCE_SWEEP_INTERVAL_SECONDS: '120',
  RECLAIM_INTERVAL_SECONDS: '600',
  RECLAIM_GRACE_SECONDS: '7200',
  RECLAIM_MAX_PER_RUN: '10',
  RECLAIM_MAX_SHARE_PERCENT: '20',
  DATABASE_LOCK_TIMEOUT_MS: '4000',
  DATABASE_STATEMENT_TIMEOUT_MS: '10000',
  DATABASE_CONNECT_TIMEOUT_MS: '4000',
  DATABASE_QUERY_TIMEOUT_MS: '15000',
  DATABASE_MAX_CONNECTIONS: '60',
};

/** What a deployer's shell may hold: every configuration variable, and the AWS and deployment ones. */
const SHELL = {
  ...CONFIGURED,
  LOG_LEVEL: 'DEBUG',
  DATABASE_DRIVER: 'tcp',
  AWS_REGION: 'eu-west-1',
  AWS_DEFAULT_REGION: 'eu-west-1',
  AWS_ENDPOINT_URL: 'http://127.0.0.1:4566',
  AWS_ENDPOINT_URL_SQS: 'http://127.0.0.1:4566',
  QUEUE_NAME_PREFIX: 'other-',
  STAGE: 'other',
  DATABASE_URL: 'postgres://cleanup:secret@db.example.com:5432/cleanup',
  SANDBOX_PROVISIONER_URL: 'https://provisioner.example.com',
  SANDBOX_PROVISIONER_TOKEN_PARAMETER: '/elsewhere/token',
  NODE_ENV: 'production',
};

const SUBNETS = ['subnet-0123456789abcdef0', 'subnet-0fedcba9876543210'];
const SECURITY_GROUPS = ['sg-0123456789abcdef0'];
const TOKEN_PARAMETER = `/runtime-cleanup/${STAGE}/sandbox-provisioner-token`;

let workDir: string;
let home: string;
let plain: PackagedService;
let fromShell: PackagedService;
let explicit: PackagedService;
const queriesOf = (template: CfnTemplate) =>
  new TemplateQueries(template, { service: 'runtime-cleanup', stage: STAGE, functionKeys: FUNCTION_KEYS });

beforeAll(async () => {
  ({ workDir, home } = await packagingWorkDir('stage-settings'));
  // The same stage and options as template.test.ts's packaging: whichever file comes first packages.
  plain = await packageService({ stage: STAGE, outputDir: join(workDir, 'plain'), home, oncePerRun: true });
  fromShell = await packageService({ stage: STAGE, outputDir: join(workDir, 'shell'), home, env: SHELL });
  explicit = await packageService({
    stage: STAGE,
    outputDir: join(workDir, 'explicit'),
    home,
    args: [
      ...Object.entries(CONFIGURED).flatMap(([name, value]) => ['--param', `${name}=${value}`]),
      '--param',
      'LOG_LEVEL=DEBUG',
      '--param',
      'DATABASE_DRIVER=tcp',
      '--param',
      `vpcSubnetIds=${SUBNETS.join(',')}`,
      '--param',
      `vpcSecurityGroupIds=${SECURITY_GROUPS.join(',')}`,
      '--param',
      'provisionerToken=true',
    ],
  });
}, 400_000);

afterAll(async () => {
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

function statementsOf(
  cfn: TemplateQueries<FunctionKey>,
  key: FunctionKey,
): Array<Statement & { Sid?: string }> {
  return cfn.roleStatements(referencedLogicalId(cfn.lambdaFunction(key).properties.Role)!);
}

describe('stage settings', () => {
  it('ignore the packaging shell: every configuration variable exported gives the same template and zips', async () => {
    expect(Object.keys(CONFIGURED).sort()).toEqual(Object.keys(CONFIG_DEFAULTS).sort());
    expect(comparableTemplate(fromShell.template)).toBe(comparableTemplate(plain.template));
    expect(await differingArtifacts(fromShell, plain)).toEqual([]);
    expect(fromShell.output).toContain(`Packaging runtime-cleanup for stage ${STAGE} (us-east-1)`);
  });

  it('take an explicit --param: each configuration variable lands in every function, and moves what derives from it', () => {
    const cfn = queriesOf(explicit.template);
    for (const key of FUNCTION_KEYS) {
      expect(cfn.environmentOf(key), key).toMatchObject({ ...CONFIGURED, LOG_LEVEL: 'DEBUG' });
    }
    const oldestFence = cfn
      .alarms()
      .find(([, alarm]) => alarm.MetricName === MetricName.OLDEST_FENCE_AGE)?.[1];
    expect(oldestFence?.Threshold).toBe(3 * 20);
    const sweeperRule = resourcesOfType(explicit.template, 'AWS::Events::Rule').find(([, rule]) =>
      String(rule.Properties?.Description).startsWith('Re-announces'),
    );
    expect(sweeperRule?.[1].Properties?.ScheduleExpression).toBe('rate(2 minutes)');
  });

  // One refusal of each kind through the real `npm run package`: a name checked before any value
  // is read, and a value that breaks its param's rule. Every rule of every param is held on the
  // function that decides it (test/unit/stage-settings.test.ts): each more here was an osls start
  // that proved no more wiring.
  it.each([
    [
      'a misspelt name',
      'FENCE_SWEEP_AFTER_SECOND=20',
      'unknown name(s) --param="FENCE_SWEEP_AFTER_SECOND=20"',
    ],
    [
      'a database driver that does not exist',
      'DATABASE_DRIVER=mysql',
      'param DATABASE_DRIVER="mysql" is invalid: must be neon or tcp, or empty',
    ],
  ])('refuse %s at package time, naming the param, its value and the rule', async (_what, param, message) => {
    const run = await runPackage(
      ['--stage', STAGE, '--package', join(workDir, 'refused'), '--param', param],
      {
        home,
      },
    );
    expect(run.code, run.output).not.toBe(0);
    expect(run.output).toContain(message);
  });
});

describe('the private network', () => {
  it('is absent unless the stage names one: no VpcConfig, no EC2 permission', () => {
    const cfn = queriesOf(plain.template);
    for (const key of FUNCTION_KEYS) {
      expect(cfn.lambdaFunction(key).properties, key).not.toHaveProperty('VpcConfig');
      const actions = statementsOf(cfn, key).flatMap((statement) => asList(statement.Action));
      expect(
        actions.filter((action) => action.startsWith('ec2:')),
        key,
      ).toEqual([]);
    }
  });

  it('puts every function into the stage’s subnets and security groups', () => {
    const cfn = queriesOf(explicit.template);
    for (const key of FUNCTION_KEYS) {
      expect(cfn.lambdaFunction(key).properties.VpcConfig, key).toEqual({
        SubnetIds: SUBNETS,
        SecurityGroupIds: SECURITY_GROUPS,
      });
    }
  });

  it('gives each role exactly the network-interface actions of AWSLambdaVPCAccessExecutionRole, held to the account and region where EC2 allows it', () => {
    const cfn = queriesOf(explicit.template);
    for (const key of FUNCTION_KEYS) {
      const ec2 = statementsOf(cfn, key).filter((statement) =>
        asList(statement.Action).some((action) => action.startsWith('ec2:')),
      );
      expect(ec2, key).toEqual([
        {
          Sid: 'DescribeNetworkForVpcAccess',
          Effect: 'Allow',
          Action: ['ec2:DescribeNetworkInterfaces', 'ec2:DescribeSubnets'],
          Resource: ['*'],
        },
        {
          Sid: 'ManageNetworkInterfacesForVpcAccess',
          Effect: 'Allow',
          Action: [
            'ec2:CreateNetworkInterface',
            'ec2:DeleteNetworkInterface',
            'ec2:AssignPrivateIpAddresses',
            'ec2:UnassignPrivateIpAddresses',
          ],
          Resource: [{ 'Fn::Sub': `arn:\${AWS::Partition}:ec2:\${AWS::Region}:\${AWS::AccountId}:*/*` }],
        },
      ]);
      // `*` nowhere else: the Describe actions are the only ones EC2 cannot scope.
      const wildcards = statementsOf(cfn, key).filter((statement) =>
        asList(statement.Resource).some((resource) => resource === '*'),
      );
      expect(wildcards.map((statement) => statement.Sid)).toEqual(['DescribeNetworkForVpcAccess']);
    }
  });
});

describe('the provisioner token', () => {
  it('is off unless the stage enables it: no parameter, no key, no grant', () => {
    const cfn = queriesOf(plain.template);
    for (const key of FUNCTION_KEYS) {
      expect(cfn.environmentOf(key), key).not.toHaveProperty('SANDBOX_PROVISIONER_TOKEN_PARAMETER');
    }
    expect(plain.template.Resources).not.toHaveProperty('ProvisionerTokenKey');
    expect(JSON.stringify(plain.template)).not.toContain('sandbox-provisioner-token');
  });

  it('reaches release and the reclaimer alone, as the name of its SecureString, readable through exactly that parameter and its own key', () => {
    const cfn = queriesOf(explicit.template);
    const tokenArn = {
      'Fn::Sub': `arn:\${AWS::Partition}:ssm:\${AWS::Region}:\${AWS::AccountId}:parameter${TOKEN_PARAMETER}`,
    };
    for (const key of FUNCTION_KEYS) {
      const env = cfn.environmentOf(key);
      const token = statementsOf(cfn, key).filter(
        (statement) =>
          JSON.stringify(statement).includes('ProvisionerToken') ||
          JSON.stringify(statement).includes(TOKEN_PARAMETER),
      );
      if (!CALLS_PROVISIONER.has(key)) {
        expect(env, key).not.toHaveProperty('SANDBOX_PROVISIONER_TOKEN_PARAMETER');
        expect(token, key).toEqual([]);
        continue;
      }
      expect(env.SANDBOX_PROVISIONER_TOKEN_PARAMETER, key).toBe(TOKEN_PARAMETER);
      expect(token, key).toEqual([
        { Sid: 'ReadProvisionerToken', Effect: 'Allow', Action: ['ssm:GetParameter'], Resource: [tokenArn] },
        {
          Sid: 'DecryptProvisionerTokenThroughSsm',
          Effect: 'Allow',
          Action: ['kms:Decrypt'],
          Resource: [{ 'Fn::GetAtt': ['ProvisionerTokenKey', 'Arn'] }],
          Condition: {
            StringEquals: {
              'kms:ViaService': { 'Fn::Sub': `ssm.\${AWS::Region}.amazonaws.com` },
              'kms:EncryptionContext:PARAMETER_ARN': tokenArn,
            },
          },
        },
      ]);
    }
    const key = explicit.template.Resources.ProvisionerTokenKey!;
    expect(key).toMatchObject({
      Type: 'AWS::KMS::Key',
      DeletionPolicy: 'Retain',
      UpdateReplacePolicy: 'Retain',
    });
    expect(key.Properties?.EnableKeyRotation).toBe(true);
    expect(explicit.template.Outputs?.ProvisionerTokenParameterName?.Value).toBe(TOKEN_PARAMETER);
    expect(explicit.template.Outputs?.ProvisionerTokenKeyAlias?.Value).toBe(
      `alias/runtime-cleanup-${STAGE}-sandbox-provisioner-token`,
    );
  });
});

describe('DATABASE_DRIVER', () => {
  it('is in no function’s environment unless the stage sets it (unset: by host), and in every one when it does', () => {
    for (const key of FUNCTION_KEYS) {
      expect(queriesOf(plain.template).environmentOf(key), key).not.toHaveProperty('DATABASE_DRIVER');
      expect(queriesOf(explicit.template).environmentOf(key).DATABASE_DRIVER, key).toBe('tcp');
    }
  });
});

describe('the platform’s policy', () => {
  it('lets the worker send to run-finished and receive and delete on runtime-cleaned, nothing else', () => {
    const cfn = queriesOf(plain.template);
    const policies = resourcesOfType(plain.template, 'AWS::IAM::ManagedPolicy');
    expect(policies.map(([id]) => id)).toEqual(['PlatformWorkerPolicy']);
    const properties = policies[0]![1].Properties!;
    expect(properties).not.toHaveProperty('Roles');
    expect(properties).not.toHaveProperty('ManagedPolicyName');
    const document = properties.PolicyDocument as { Statement: Statement[] };
    expect(document.Statement).toEqual([
      {
        Sid: 'AnnounceFinishedRuns',
        Effect: 'Allow',
        Action: ['sqs:SendMessage'],
        Resource: [{ 'Fn::GetAtt': [cfn.queueLogicalIdByBaseName('run-finished'), 'Arn'] }],
      },
      {
        Sid: 'ConsumeRuntimeCleaned',
        Effect: 'Allow',
        Action: ['sqs:ReceiveMessage', 'sqs:DeleteMessage'],
        Resource: [{ 'Fn::GetAtt': [cfn.queueLogicalIdByBaseName('runtime-cleaned'), 'Arn'] }],
      },
    ]);
  });

  it('needs neither GetQueueUrl nor KMS: the queue URLs are outputs and the queues use SQS-managed keys', () => {
    const cfn = queriesOf(plain.template);
    const outputs = plain.template.Outputs ?? {};
    expect(referencedLogicalId(outputs.PlatformWorkerPolicyArn?.Value)).toBe('PlatformWorkerPolicy');
    for (const queue of ['run-finished', 'runtime-cleaned']) {
      const id = cfn.queueLogicalIdByBaseName(queue);
      expect(referencedLogicalId(outputs[`${id}Url`]?.Value), queue).toBe(id);
      expect(cfn.props(id), queue).toMatchObject({ SqsManagedSseEnabled: true });
      expect(cfn.props(id), queue).not.toHaveProperty('KmsMasterKeyId');
    }
  });
});
