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
const { databaseUrlKeyResources, functionRoles } = require('./iam.cjs');
const { queueLogicalId } = require('./names.cjs');
const {
  assertTimeoutLadder,
  effectiveConfiguration,
  loadProjectFacts,
  projectFacts,
} = require('./project.cjs');
const { queueResources } = require('./queues.cjs');

/** The sweeper and the reclaimer run on a schedule instead of consuming a queue. */
const SWEEPER = 'sweeper';
const RECLAIMER = 'reclaimer';

async function deploymentContext(resolveVariable) {
  await loadProjectFacts();
  const stage = await resolveVariable('sls:stage');
  const service = await resolveVariable('self:service');
  const prefix = await resolveVariable('self:custom.queueNamePrefix');
  const config = effectiveConfiguration(process.env);
  assertTimeoutLadder(config);
  return { stage, service, prefix, config };
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
   * AWS_ENDPOINT_URL_SQS stays unset: unset means real SQS (contract).
   */
  environment: async ({ resolveVariable }) => {
    const { stage, prefix, config } = await deploymentContext(resolveVariable);
    const { SERVICE_NAME, METRICS_NAMESPACE } = projectFacts();
    return {
      STAGE: stage,
      LOG_LEVEL: await resolveVariable('self:custom.logLevel'),
      POWERTOOLS_SERVICE_NAME: SERVICE_NAME,
      POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
      QUEUE_NAME_PREFIX: prefix,
      DATABASE_URL_PARAMETER: await resolveVariable('self:custom.ssmParameters.databaseUrl'),
      // The effective values, defaults included, so the console shows what the functions run with.
      ...Object.fromEntries(Object.entries(config).map(([name, value]) => [name, String(value)])),
    };
  },

  /**
   * Only the release function calls the provisioner, so only it gets SANDBOX_PROVISIONER_URL: a
   * CloudFormation dynamic reference to an SSM String parameter, resolved at deploy time (packaging
   * needs no AWS access, and the value never lands in the template file or in git). It is an
   * address, not a credential; put a token in it and it becomes readable with the function's
   * configuration, like any environment variable.
   */
  releaseEnvironment: async ({ resolveVariable }) => {
    await deploymentContext(resolveVariable);
    const provisionerUrlParameter = await resolveVariable('self:custom.ssmParameters.provisionerUrl');
    return { SANDBOX_PROVISIONER_URL: `{{resolve:ssm:${provisionerUrlParameter}}}` };
  },

  /** The reclaimer lists and deletes at the same provisioner as release: the same parameter. */
  reclaimerEnvironment: async ({ resolveVariable }) => {
    await deploymentContext(resolveVariable);
    const provisionerUrlParameter = await resolveVariable('self:custom.ssmParameters.provisionerUrl');
    return { SANDBOX_PROVISIONER_URL: `{{resolve:ssm:${provisionerUrlParameter}}}` };
  },

  /**
   * The reclaimer's invocation settings, for the sweeper's reasons: one instance (two would race
   * each other's streaks and double the provisioner's load), no retries (the next run is the
   * retry), no run older than one interval.
   */
  reclaimerInvocation: async ({ resolveVariable }) => {
    const { config } = await deploymentContext(resolveVariable);
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
  sweeperInvocation: async ({ resolveVariable }) => {
    const { config } = await deploymentContext(resolveVariable);
    const { FUNCTION_DEFINITIONS } = projectFacts();
    return {
      reservedConcurrency: FUNCTION_DEFINITIONS[SWEEPER].reservedConcurrency,
      maximumRetryAttempts: 0,
      maximumEventAge: Math.max(60, config.FENCE_SWEEP_INTERVAL_SECONDS),
    };
  },

  /** Each function's event sources: its queue from queues.json, or the sweeper's schedule. */
  events: async ({ resolveVariable }) => {
    const { config } = await deploymentContext(resolveVariable);
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
   * The queues, the database URL's key, the roles, alarms and dashboard, with outputs for
   * producers and operators.
   */
  resources: async ({ resolveVariable }) => {
    const { stage, service, prefix, config } = await deploymentContext(resolveVariable);
    const databaseUrlParameter = await resolveVariable('self:custom.ssmParameters.databaseUrl');
    const alarmSubscription = await resolveVariable('self:custom.alarmSubscription');
    const queues = queueResources({ prefix });
    const key = databaseUrlKeyResources({ stage, service, databaseUrlParameter });
    const alarms = alarmResources({ stage, service, config, subscription: alarmSubscription });
    const dashboard = dashboardResources({ stage, service, alarmLogicalIds: alarms.alarmLogicalIds });
    return {
      Resources: {
        ...queues.resources,
        ...key.resources,
        ...functionRoles({ databaseUrlParameter }),
        ...alarms.resources,
        ...dashboard,
      },
      Outputs: {
        ...queues.outputs,
        ...key.outputs,
        ...alarms.outputs,
        DashboardName: { Description: 'The CloudWatch dashboard of this stage', Value: { Ref: 'Dashboard' } },
      },
    };
  },

  sweepRate,
};
