'use strict';

/**
 * The alarms an operator is paged by, each with a description that says what it means and what to
 * do (`Means: … Do: …`), all notifying one SNS topic. Thresholds are derived from the same
 * configuration the functions run with, so raising a timeout moves its alarm with it.
 */
const { projectFacts, retryBudgetSeconds } = require('./project.cjs');
const { deadLetterQueueLogicalId, pascal, queueLogicalId } = require('./names.cjs');
const { deadLetterQueues } = require('./queues.cjs');

const ALARM_TOPIC_LOGICAL_ID = 'AlarmTopic';

/**
 * How the sweeper emits its stored metrics (functions/sweeper/handler.ts through
 * adapters/observability.ts): the default dimensions `service`, `stage` and `function`, with
 * `function` = the name it passes to dependenciesFromEnvironment. An alarm on a metric must name
 * the exact dimension set, or it watches a series nobody writes and stays green forever; the
 * template test runs the bundled sweeper and compares.
 */
const SWEEPER_FUNCTION_DIMENSION = 'sweeper';

/** A fence re-announced twice by the sweeper without being cleared has stopped converging. */
const OLDEST_FENCE_SWEEPS = 3;
/** Release failures per 5 minutes that, sustained for 15 minutes, mean the provisioner path is broken. */
const RELEASE_FAILURES_PER_PERIOD = 5;

function notify(alarm) {
  const actions = [{ Ref: ALARM_TOPIC_LOGICAL_ID }];
  return { ...alarm, ActionsEnabled: true, AlarmActions: actions, OKActions: actions };
}

function describe(means, todo) {
  return `Means: ${means} Do: ${todo}`;
}

/**
 * @param {{ stage: string, service: string, config: Record<string, number> }} options
 *   `service` is the osls service (the alarm names' prefix); `config` the effective configuration.
 * @returns {{ resources: Record<string, object>, outputs: Record<string, object>, alarmLogicalIds: string[] }}
 */
function alarmResources({ stage, service, config }) {
  const { MetricName, METRICS_NAMESPACE, SERVICE_NAME, QueueName } = projectFacts();
  const resources = {
    [ALARM_TOPIC_LOGICAL_ID]: {
      Type: 'AWS::SNS::Topic',
      // Not encrypted with the AWS-managed SNS key: CloudWatch alarms cannot publish to a topic
      // under that key's policy. Alarm notifications carry names and numbers, no secrets.
      Properties: { TopicName: `${service}-${stage}-alarms`, DisplayName: `${service} ${stage} alarms` },
    },
  };
  const name = (suffix) => `${service}-${stage}-${suffix}`;

  for (const { source, name: dlqName } of deadLetterQueues()) {
    resources[`${pascal(source)}DeadLetterAlarm`] = {
      Type: 'AWS::CloudWatch::Alarm',
      Properties: notify({
        AlarmName: name(`dead-letters-${dlqName}`),
        AlarmDescription: describe(
          `at least one message is in ${dlqName}: a ${source} message that can never succeed (malformed body, unknown run, a non-retryable failure) or that ran out of retries. Its run's fence, if any, stays pending and blocks the scope; the sweeper re-announces it after FENCE_SWEEP_AFTER_SECONDS.`,
          `run \`npm run ops -- dlq\` (QUEUE_NAME_PREFIX=${stage}-) to read each dead letter's reason and errorCode, and \`npm run ops -- explain <runId>\` for its run; fix the cause, then \`npm run ops -- redrive ${source}\`. The alarm clears when the DLQ is empty.`,
        ),
        Namespace: 'AWS/SQS',
        MetricName: 'ApproximateNumberOfMessagesVisible',
        Dimensions: [
          { Name: 'QueueName', Value: { 'Fn::GetAtt': [deadLetterQueueLogicalId(source), 'QueueName'] } },
        ],
        Statistic: 'Maximum',
        Period: 60,
        EvaluationPeriods: 1,
        Threshold: 0,
        ComparisonOperator: 'GreaterThanThreshold',
        // SQS stops reporting an idle empty queue: no data means no dead letters.
        TreatMissingData: 'notBreaching',
      }),
    };
  }

  const oldestFenceThreshold = OLDEST_FENCE_SWEEPS * config.FENCE_SWEEP_AFTER_SECONDS;
  resources.OldestFenceAgeAlarm = {
    Type: 'AWS::CloudWatch::Alarm',
    Properties: notify({
      AlarmName: name('oldest-fence-age'),
      AlarmDescription: describe(
        `a root run's runtime_cleanup_pending fence has been up for more than ${oldestFenceThreshold} s (${OLDEST_FENCE_SWEEPS} x FENCE_SWEEP_AFTER_SECONDS): the sweeper re-announced it and cleanup still did not converge, so new runs in that scope are blocked. Missing data counts too: the sweeper has stopped reporting.`,
        `\`npm run ops -- fences\` lists pending fences oldest first; \`npm run ops -- explain <runId>\` shows why one is stuck (dead letter, failing release, active run in the scope). Fix the cause and \`npm run ops -- retry <runId>\`; \`force-clear\` only as a last resort. If the sweeper is silent, check its Lambda errors and DATABASE_URL.`,
      ),
      Namespace: METRICS_NAMESPACE,
      MetricName: MetricName.OLDEST_FENCE_AGE,
      Dimensions: [
        { Name: 'service', Value: SERVICE_NAME },
        { Name: 'stage', Value: stage },
        { Name: 'function', Value: SWEEPER_FUNCTION_DIMENSION },
      ],
      Statistic: 'Maximum',
      Period: 300,
      EvaluationPeriods: 3,
      DatapointsToAlarm: 3,
      Threshold: oldestFenceThreshold,
      ComparisonOperator: 'GreaterThanThreshold',
      // The sweeper reports every FENCE_SWEEP_INTERVAL_SECONDS, zero included: silence is a fault.
      TreatMissingData: 'breaching',
    }),
  };

  // ReleaseFailed carries an errorCode dimension, so one series exists per code. A Metrics Insights
  // query sums them all, including codes added later; a metric-math sum of named series would not.
  resources.ReleaseFailuresAlarm = {
    Type: 'AWS::CloudWatch::Alarm',
    Properties: notify({
      AlarmName: name('release-failures'),
      AlarmDescription: describe(
        `more than ${RELEASE_FAILURES_PER_PERIOD} sandbox releases failed in each of the last three 5-minute periods (any errorCode). Their fences stay up and scopes stay blocked while the releases retry with backoff.`,
        `read ReleaseFailed by errorCode on the dashboard: PROVISIONER_* means the provisioner is down or slow (check SANDBOX_PROVISIONER_URL and its health), RELEASE_LOCK_TIMEOUT means contention on one scope, CLEANUP_TIMEOUT means deletes take longer than SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS (raise it together with the release function's timeout in infra/queues.json).`,
      ),
      Metrics: [
        {
          Id: 'failures',
          Expression: `SELECT SUM(${MetricName.RELEASE_FAILED}) FROM "${METRICS_NAMESPACE}" WHERE service = '${SERVICE_NAME}' AND stage = '${stage}'`,
          Period: 300,
          ReturnData: true,
        },
      ],
      EvaluationPeriods: 3,
      DatapointsToAlarm: 3,
      Threshold: RELEASE_FAILURES_PER_PERIOD,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
    }),
  };

  const releaseAgeThreshold = retryBudgetSeconds(QueueName.RUNTIME_RELEASE, config);
  resources.ReleaseQueueAgeAlarm = {
    Type: 'AWS::CloudWatch::Alarm',
    Properties: notify({
      AlarmName: name('release-queue-oldest-message'),
      AlarmDescription: describe(
        `a release command has waited in ${QueueName.RUNTIME_RELEASE} for more than ${releaseAgeThreshold} s, longer than all its allowed attempts and backoffs take: releases are not being consumed (event source disabled, throttled at maximumConcurrency, function failing to start) or one message group is stuck.`,
        `check the release function's errors, throttles and event source mapping, and its logs for a configuration line failing at cold start (\`npm run ops -- check-config\` validates the same rules); a single stuck group (<uid>:<runtime_scope_id>) shows in \`npm run ops -- fences\`.`,
      ),
      Namespace: 'AWS/SQS',
      MetricName: 'ApproximateAgeOfOldestMessage',
      Dimensions: [
        {
          Name: 'QueueName',
          Value: { 'Fn::GetAtt': [queueLogicalId(QueueName.RUNTIME_RELEASE), 'QueueName'] },
        },
      ],
      Statistic: 'Maximum',
      Period: 300,
      EvaluationPeriods: 1,
      Threshold: releaseAgeThreshold,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
    }),
  };

  const alarmLogicalIds = Object.keys(resources).filter((id) => id !== ALARM_TOPIC_LOGICAL_ID);
  const outputs = {
    AlarmTopicArn: {
      Description: 'Subscribe on-call to this topic: every alarm of the stage notifies it',
      Value: { Ref: ALARM_TOPIC_LOGICAL_ID },
    },
  };
  return { resources, outputs, alarmLogicalIds };
}

module.exports = { alarmResources, ALARM_TOPIC_LOGICAL_ID, SWEEPER_FUNCTION_DIMENSION };
