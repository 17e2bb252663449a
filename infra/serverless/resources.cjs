'use strict';

/**
 * What serverless.yml reads through `${file(./infra/serverless/resources.cjs):…}`: the functions'
 * environment and event sources and the CloudFormation resources, all generated from
 * `infra/queues.json`, metric-names.ts and config.ts so that no number or name is written twice.
 *
 * Each export is a function osls calls with `resolveVariable`; none of them touches the network
 * or needs AWS credentials, so `npm run package` works on a fresh clone.
 */
const { alarmResources } = require('./alarms.cjs');
const { dashboardResources } = require('./dashboard.cjs');
const {
  functionRoles,
  platformWorkerPolicy,
  SECURE_PARAMETERS,
  secureParameterKeyResources,
} = require('./iam.cjs');
const { queueLogicalId } = require('./names.cjs');
const { assertTimeoutLadder, loadProjectFacts, projectFacts } = require('./project.cjs');
const { queueResources } = require('./queues.cjs');
const { stageSettings } = require('./stage.cjs');

/** The sweeper and the reclaimer run on a schedule instead of consuming a queue. */
const SWEEPER = 'sweeper';
const RECLAIMER = 'reclaimer';

/**
 * What every export below is generated from: the stage's settings (stage.cjs: serverless.yml's
 * params and explicit --param values, never the shell's environment), checked against the
 * timeout ladder and the connection budget before anything is generated.
 */
async function deploymentContext(osls) {
  await loadProjectFacts();
  const settings = await stageSettings(osls);
  assertTimeoutLadder(settings.config);
  const service = await osls.resolveVariable('self:service');
  const prefix = await osls.resolveVariable('self:custom.queueNamePrefix');
  const parameterNames = {
    databaseUrl: await osls.resolveVariable('self:custom.ssmParameters.databaseUrl'),
    provisionerUrl: await osls.resolveVariable('self:custom.ssmParameters.provisionerUrl'),
    provisionerToken: settings.provisionerToken
      ? await osls.resolveVariable('self:custom.ssmParameters.provisionerToken')
      : undefined,
  };
  return { ...settings, service, prefix, parameterNames };
}

/**
 * The environment of the functions that call the provisioner (iam.cjs, PROVISIONER_CALLERS): its URL, a
 * CloudFormation dynamic reference to an SSM String parameter resolved at deploy time (packaging
 * needs no AWS access, and the value never lands in the template file or in git; it is an
 * address, not a credential), and, when the stage enables it, the name of the SecureString that
 * holds the provisioner's bearer token, read at cold start like the database URL (a token in the
 * environment would be readable with the function's configuration).
 */
async function provisionerEnvironment(osls) {
  const { parameterNames } = await deploymentContext(osls);
  return {
    SANDBOX_PROVISIONER_URL: `{{resolve:ssm:${parameterNames.provisionerUrl}}}`,
    ...(parameterNames.provisionerToken
      ? { SANDBOX_PROVISIONER_TOKEN_PARAMETER: parameterNames.provisionerToken }
      : {}),
  };
}

/**
 * EventBridge rates are whole minutes (at least one); an interval that is not a multiple of 60 s
 * is rounded up, so the sweeper never runs more often than FENCE_SWEEP_INTERVAL_SECONDS asks.
 */
function sweepRate(intervalSeconds) {
  const minutes = Math.max(1, Math.ceil(intervalSeconds / 60));
  return minutes === 1 ? 'rate(1 minute)' : `rate(${minutes} minutes)`;
}

module.exports = {
  /**
   * Every function's environment: the configuration variables of docs/integration.md, section 4,
   * that all of them use, plus the deployment's own.
   *
   * No connection string: DATABASE_URL_PARAMETER names the SSM SecureString parameter that holds
   * it, and each function reads it at cold start (adapters/database-url.ts). A value in the
   * environment would be readable by anyone allowed lambda:GetFunctionConfiguration, and
   * CloudFormation refuses `ssm-secure` references in Lambda environment variables.
   *
   * AWS_ENDPOINT_URL_SQS stays unset (unset means real SQS, contract) unless the stage names an
   * awsEndpointUrl: the local stage's LocalStack, which the functions then reach for SQS and SSM
   * (docs/localstack.md). DATABASE_DRIVER is passed only when the stage sets it (unset: by host).
   */
  environment: async (osls) => {
    const { stage, prefix, config, logLevel, databaseDriver, awsEndpointUrl, parameterNames } =
      await deploymentContext(osls);
    const { SERVICE_NAME, METRICS_NAMESPACE } = projectFacts();
    return {
      STAGE: stage,
      LOG_LEVEL: logLevel,
      POWERTOOLS_SERVICE_NAME: SERVICE_NAME,
      POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
      QUEUE_NAME_PREFIX: prefix,
      DATABASE_URL_PARAMETER: parameterNames.databaseUrl,
      // The effective values, defaults included, so the console shows what the functions run with.
      ...Object.fromEntries(Object.entries(config).map(([name, value]) => [name, String(value)])),
      ...(databaseDriver ? { DATABASE_DRIVER: databaseDriver } : {}),
      ...(awsEndpointUrl
        ? { AWS_ENDPOINT_URL_SQS: awsEndpointUrl, AWS_ENDPOINT_URL_SSM: awsEndpointUrl }
        : {}),
    };
  },

  /** `provider.architecture`: the stage's, validated (osls only warns about a wrong one). */
  architecture: async (osls) => (await deploymentContext(osls)).architecture,

  /**
   * `provider.vpc`: the stage's private network, or null (serverless.yml falls back to null, and
   * osls then writes no VpcConfig at all). The roles get the network-interface permissions it
   * needs (iam.cjs).
   */
  vpc: async (osls) => {
    const { privateNetwork } = await deploymentContext(osls);
    return privateNetwork ?? null;
  },

  /** Release deletes at the provisioner: provisionerEnvironment above. */
  releaseEnvironment: provisionerEnvironment,

  /** The reclaimer lists and deletes at the same provisioner as release: the same parameters. */
  reclaimerEnvironment: provisionerEnvironment,

  /**
   * The reclaimer's invocation settings, for the sweeper's reasons: one instance (two would race
   * each other's streaks and double the provisioner's load), no retries (the next run is the
   * retry), no run older than one interval.
   */
  reclaimerInvocation: async (osls) => {
    const { config } = await deploymentContext(osls);
    const { FUNCTION_DEFINITIONS } = projectFacts();
    return {
      reservedConcurrency: FUNCTION_DEFINITIONS[RECLAIMER].reservedConcurrency,
      maximumRetryAttempts: 0,
      maximumEventAge: Math.max(60, config.RECLAIM_INTERVAL_SECONDS),
    };
  },

  /**
   * The sweeper's invocation settings. EventBridge invokes it asynchronously, and Lambda retries a
   * failed asynchronous invocation twice by default, the retries overlapping the next tick: zero
   * retries, because the next tick is the retry. An event older than one interval is dropped for
   * the same reason (60 s is Lambda's minimum). One instance at a time (reserved concurrency from
   * infra/queues.json) also bounds its database connections.
   */
  sweeperInvocation: async (osls) => {
    const { config } = await deploymentContext(osls);
    const { FUNCTION_DEFINITIONS } = projectFacts();
    return {
      reservedConcurrency: FUNCTION_DEFINITIONS[SWEEPER].reservedConcurrency,
      maximumRetryAttempts: 0,
      maximumEventAge: Math.max(60, config.FENCE_SWEEP_INTERVAL_SECONDS),
    };
  },

  /** Each function's event sources: its queue from queues.json, or the sweeper's schedule. */
  events: async (osls) => {
    const { config } = await deploymentContext(osls);
    const { QUEUE_DEFINITIONS, FUNCTION_DEFINITIONS } = projectFacts();
    const events = Object.fromEntries(Object.keys(FUNCTION_DEFINITIONS).map((key) => [key, []]));
    for (const [name, queue] of Object.entries(QUEUE_DEFINITIONS)) {
      if (!queue.consumer) continue;
      const settings = FUNCTION_DEFINITIONS[queue.consumer];
      if (!settings.maximumConcurrency) {
        // Its instances, and so its database connections, would have no bound (connection-budget.ts).
        throw new Error(
          `infra/queues.json: functions.${queue.consumer} consumes ${name} and needs maximumConcurrency`,
        );
      }
      events[queue.consumer].push({
        sqs: {
          arn: { 'Fn::GetAtt': [queueLogicalId(name), 'Arn'] },
          batchSize: settings.batchSize,
          // Lambda rejects a batching window on FIFO sources (assertTimeoutLadder keeps it 0 there).
          ...(queue.fifo ? {} : { maximumBatchingWindow: settings.maximumBatchingWindowInSeconds }),
          // Without it one failed record fails (and redelivers) the whole batch.
          functionResponseType: 'ReportBatchItemFailures',
          maximumConcurrency: settings.maximumConcurrency,
        },
      });
    }
    events[SWEEPER].push({
      schedule: {
        rate: [sweepRate(config.FENCE_SWEEP_INTERVAL_SECONDS)],
        description:
          'Re-announces fences pending longer than FENCE_SWEEP_AFTER_SECONDS; reports the fence backlog',
      },
    });
    events[RECLAIMER].push({
      schedule: {
        rate: [sweepRate(config.RECLAIM_INTERVAL_SECONDS)],
        description:
          'Lists the provisioner and deletes sandboxes no scope has owned for RECLAIM_GRACE_SECONDS',
      },
    });
    for (const [key, list] of Object.entries(events)) {
      if (!list.length)
        throw new Error(`infra/serverless/resources.cjs: function "${key}" has no event source`);
    }
    return events;
  },

  /**
   * The queues, the keys of the SecureString parameters, the roles, the platform's policy, alarms
   * and dashboard, with outputs for producers and operators.
   */
  resources: async (osls) => {
    const { stage, service, prefix, config, parameterNames, privateNetwork, alarmSubscription } =
      await deploymentContext(osls);
    const queues = queueResources({ prefix });
    const secrets = [
      secureParameterKeyResources({
        name: SECURE_PARAMETERS.DATABASE_URL,
        parameter: parameterNames.databaseUrl,
        what: 'the database URL',
        stage,
        service,
      }),
      ...(parameterNames.provisionerToken
        ? [
            secureParameterKeyResources({
              name: SECURE_PARAMETERS.PROVISIONER_TOKEN,
              parameter: parameterNames.provisionerToken,
              what: "the sandbox provisioner's bearer token",
              stage,
              service,
            }),
          ]
        : []),
    ];
    const platform = platformWorkerPolicy({ stage, service });
    const alarms = alarmResources({ stage, service, config, subscription: alarmSubscription });
    const dashboard = dashboardResources({ stage, service, alarmLogicalIds: alarms.alarmLogicalIds });
    return {
      Resources: {
        ...queues.resources,
        ...Object.assign({}, ...secrets.map((secret) => secret.resources)),
        ...functionRoles({
          databaseUrlParameter: parameterNames.databaseUrl,
          provisionerTokenParameter: parameterNames.provisionerToken,
          privateNetwork: privateNetwork !== undefined,
        }),
        ...platform.resources,
        ...alarms.resources,
        ...dashboard,
      },
      Outputs: {
        ...queues.outputs,
        ...Object.assign({}, ...secrets.map((secret) => secret.outputs)),
        ...platform.outputs,
        ...alarms.outputs,
        DashboardName: { Description: 'The CloudWatch dashboard of this stage', Value: { Ref: 'Dashboard' } },
      },
    };
  },

  sweepRate,
};
