'use strict';

/**
 * The alarms an operator is paged by, each with a description that says what it means and what to
 * do (`Means: … Do: …`), all notifying one SNS topic. Thresholds are derived from the same
 * configuration the functions run with, so raising a timeout moves its alarm with it.
 */
const { projectFacts, retryBudgetSeconds } = require('./project.cjs');
const { deadLetterQueueLogicalId, functionLogicalId, pascal, queueLogicalId } = require('./names.cjs');
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
/** The same for the reclaimer (functions/reclaimer/handler.ts). */
const RECLAIMER_FUNCTION_DIMENSION = 'reclaimer';
/** A leak still open this many intervals after its grace should have been reclaimed. */
const LEAK_PERSISTS_INTERVALS = 3;

/** A fence re-announced twice by the sweeper without being cleared has stopped converging. */
const OLDEST_FENCE_SWEEPS = 3;
/** Release failures per 5 minutes that, sustained for 15 minutes, mean the provisioner path is broken. */
const RELEASE_FAILURES_PER_PERIOD = 5;

/**
 * Who is paged: `--param="alarmSubscription=<email address or https:// URL>"` at package or
 * deploy time (docs/deploying.md, section 7). Without it the topic has no subscriber: subscribe
 * to the AlarmTopicArn output another way, or nobody is paged.
 */
const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;

/** @returns {{ Protocol: 'email' | 'https', Endpoint: string } | undefined} */
function subscriptionOf(value) {
  const endpoint = (value ?? '').trim();
  if (!endpoint) return undefined;
  if (EMAIL.test(endpoint)) return { Protocol: 'email', Endpoint: endpoint };
  let url;
  try {
    url = new URL(endpoint);
  } catch {}
  if (url?.protocol === 'https:') return { Protocol: 'https', Endpoint: endpoint };
  throw new Error(
    `alarmSubscription "${endpoint}" must be an email address or an https:// URL (alarms reach a person through it)`,
  );
}

/** What each function's failed invocations mean, and where to look first. */
const FUNCTION_ERRORS_TODO = {
  fenceCheck: 'fence checks are not running, so fences stay up and run-finished grows',
  release: 'sandboxes are not being deleted, so fences stay up and runtime-release.fifo grows',
  finalize: 'fences are not being cleared although their sandboxes are gone',
  sweeper: 'fences whose announcement was lost are not re-announced, and PendingFences/OldestFenceAge stop',
  reclaimer: 'leaked sandboxes are not being reclaimed, and OldestLeakAge stops',
};

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
function alarmResources({ stage, service, config, subscription }) {
  const { MetricName, METRICS_NAMESPACE, SERVICE_NAME, QUEUE_DEFINITIONS, FUNCTION_DEFINITIONS } =
    projectFacts();
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

  // The reclaimer reports every RECLAIM_INTERVAL_SECONDS. Its period is at least one interval, so
  // every period holds a run.
  const reclaimPeriod = Math.max(300, Math.ceil(config.RECLAIM_INTERVAL_SECONDS / 60) * 60);
  const reclaimerDimensions = [
    { Name: 'service', Value: SERVICE_NAME },
    { Name: 'stage', Value: stage },
    { Name: 'function', Value: RECLAIMER_FUNCTION_DIMENSION },
  ];
  resources.ReclaimRefusedAlarm = {
    Type: 'AWS::CloudWatch::Alarm',
    Properties: notify({
      AlarmName: name('reclaim-refused'),
      AlarmDescription: describe(
        `reclaim runs were refused in two periods in a row: the provisioner's listing could not be trusted (not JSON, wrong shape, count mismatch, unreachable) or more than RECLAIM_MAX_SHARE_PERCENT (${config.RECLAIM_MAX_SHARE_PERCENT}%) of it looked leaked at once. Nothing was deleted; leaks accumulate meanwhile.`,
        `read ReclaimRefused by reason on the dashboard and the reclaimer's "reclaim run refused" log line. share_exceeded: check that DATABASE_URL and SANDBOX_PROVISIONER_URL belong to the same stage (an empty or wrong database makes every sandbox look leaked; no_known_sandboxes: the database names none of the listed sandboxes); \`npm run ops -- orphans\` shows what it sees. list_*: check the provisioner's GET /api/sandboxes.`,
      ),
      Namespace: METRICS_NAMESPACE,
      MetricName: MetricName.RECLAIM_REFUSED,
      Dimensions: reclaimerDimensions,
      Statistic: 'Sum',
      Period: reclaimPeriod,
      EvaluationPeriods: 2,
      DatapointsToAlarm: 2,
      Threshold: 0,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
    }),
  };
  const leakThreshold =
    config.RECLAIM_GRACE_SECONDS + LEAK_PERSISTS_INTERVALS * config.RECLAIM_INTERVAL_SECONDS;
  resources.PersistingLeaksAlarm = {
    Type: 'AWS::CloudWatch::Alarm',
    Properties: notify({
      AlarmName: name('persisting-leaks'),
      AlarmDescription: describe(
        `a leaked sandbox has been seen for more than ${leakThreshold} s (RECLAIM_GRACE_SECONDS + ${LEAK_PERSISTS_INTERVALS} x RECLAIM_INTERVAL_SECONDS) without being reclaimed: its DELETE keeps failing, a run keeps arriving over the RECLAIM_MAX_PER_RUN bound, or the listing names a generation the provisioner refuses. Missing data counts too: the reclaimer has stopped reporting.`,
        `\`npm run ops -- orphans\` lists the leaks, why they count as leaked and what each waits for; the reclaimer's "leaked sandbox reclaim failed" lines say why a DELETE failed. \`npm run ops -- reclaim --yes\` runs it now. If the reclaimer is silent, check its Lambda errors and SANDBOX_PROVISIONER_URL.`,
      ),
      Namespace: METRICS_NAMESPACE,
      MetricName: MetricName.OLDEST_LEAK_AGE,
      Dimensions: reclaimerDimensions,
      Statistic: 'Maximum',
      Period: reclaimPeriod,
      EvaluationPeriods: 2,
      DatapointsToAlarm: 2,
      Threshold: leakThreshold,
      ComparisonOperator: 'GreaterThanThreshold',
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

  // Emitted by the release and the reclaimer (one series per function): summed over both, so one
  // refused DELETE pages. A wrong SANDBOX_PROVISIONER_URL fails every cleanup until it is fixed.
  resources.ProvisionerUrlUnverifiedAlarm = {
    Type: 'AWS::CloudWatch::Alarm',
    Properties: notify({
      AlarmName: name('provisioner-url-unverified'),
      AlarmDescription: describe(
        `a DELETE was answered 404/410 from a SANDBOX_PROVISIONER_URL whose GET /api/sandboxes is not the provisioner's listing (a web framework's "no such route" at a wrong path prefix, a gateway route missing): no fence clears, every release dead-letters with PROVISIONER_URL_UNVERIFIED, the sandboxes live on.`,
        `read a dead letter's reason (\`npm run ops -- dlq\`): it names the URL and what its listing answered. Fix SANDBOX_PROVISIONER_URL (or the gateway route) so that GET <url>/api/sandboxes answers the listing, deploy, then \`npm run ops -- redrive runtime-release.fifo\`.`,
      ),
      Metrics: [
        {
          Id: 'refused',
          Expression: `SELECT SUM(${MetricName.PROVISIONER_URL_UNVERIFIED}) FROM "${METRICS_NAMESPACE}" WHERE service = '${SERVICE_NAME}' AND stage = '${stage}'`,
          Period: 300,
          ReturnData: true,
        },
      ],
      EvaluationPeriods: 1,
      DatapointsToAlarm: 1,
      Threshold: 0,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
    }),
  };

  // Every consumed queue: a message older than all its attempts and backoffs take is neither being
  // processed nor on its way to the DLQ.
  for (const [queue, definition] of Object.entries(QUEUE_DEFINITIONS)) {
    if (!definition.consumer) continue;
    const threshold = retryBudgetSeconds(queue, config);
    const consumer = definition.consumer;
    const base = queue.replace(/\.fifo$/, '');
    resources[`${pascal(queue)}QueueAgeAlarm`] = {
      Type: 'AWS::CloudWatch::Alarm',
      Properties: notify({
        AlarmName: name(`oldest-message-${base}`),
        AlarmDescription: describe(
          `a message has waited in ${queue} for more than ${threshold} s, longer than all its allowed attempts and backoffs take: ${consumer} is not consuming it (event source disabled, throttled, failing at cold start)${definition.fifo ? ' or one message group is stuck' : ''}. Fences behind it stay up.`,
          `check the ${consumer} function's Errors and Throttles alarms, its event source mapping, and its log group for the one line a failing cold start prints (a configuration variable, or the DATABASE_URL parameter); \`npm run ops -- check-config\` validates the same rules, \`npm run ops -- fences\` shows what waits.`,
        ),
        Namespace: 'AWS/SQS',
        MetricName: 'ApproximateAgeOfOldestMessage',
        Dimensions: [{ Name: 'QueueName', Value: { 'Fn::GetAtt': [queueLogicalId(queue), 'QueueName'] } }],
        Statistic: 'Maximum',
        Period: 300,
        EvaluationPeriods: 1,
        Threshold: threshold,
        ComparisonOperator: 'GreaterThanThreshold',
        TreatMissingData: 'notBreaching',
      }),
    };
  }

  // Every function: invocations that failed as a whole (a record that fails alone is a partial
  // batch failure, not an Error) and invocations Lambda refused.
  for (const functionKey of Object.keys(FUNCTION_DEFINITIONS)) {
    const functionName = { Ref: functionLogicalId(functionKey) };
    resources[`${pascal(functionKey)}ErrorsAlarm`] = {
      Type: 'AWS::CloudWatch::Alarm',
      Properties: notify({
        AlarmName: name(`errors-${functionKey}`),
        AlarmDescription: describe(
          `invocations of ${functionKey} failed as a whole in two 5-minute periods in a row: ${FUNCTION_ERRORS_TODO[functionKey]}. Usually a cold start that cannot finish (a configuration value, the DATABASE_URL parameter or its KMS key), a timeout, or a crash.`,
          `read the function's log group: a failing cold start prints one line naming the variable or the SSM parameter. \`npm run ops -- check-config\` validates the configuration; fix it and the next invocation starts again.`,
        ),
        Namespace: 'AWS/Lambda',
        MetricName: 'Errors',
        Dimensions: [{ Name: 'FunctionName', Value: functionName }],
        Statistic: 'Sum',
        Period: 300,
        EvaluationPeriods: 2,
        DatapointsToAlarm: 2,
        Threshold: 0,
        ComparisonOperator: 'GreaterThanThreshold',
        TreatMissingData: 'notBreaching',
      }),
    };
    resources[`${pascal(functionKey)}ThrottlesAlarm`] = {
      Type: 'AWS::CloudWatch::Alarm',
      Properties: notify({
        AlarmName: name(`throttles-${functionKey}`),
        AlarmDescription: describe(
          `Lambda refused invocations of ${functionKey} in two 5-minute periods in a row: the account's concurrency is used up by other functions, or ${functionKey} hit its own reserved concurrency. Messages wait in their queue meanwhile; nothing is lost.`,
          `compare the account's ConcurrentExecutions with its limit and find what uses it; the event sources' MaximumConcurrency (infra/queues.json) keeps this service within its own bounds, so throttles mean the account is short. Raise the account limit or reserve concurrency for these functions within DATABASE_MAX_CONNECTIONS.`,
        ),
        Namespace: 'AWS/Lambda',
        MetricName: 'Throttles',
        Dimensions: [{ Name: 'FunctionName', Value: functionName }],
        Statistic: 'Sum',
        Period: 300,
        EvaluationPeriods: 2,
        DatapointsToAlarm: 2,
        Threshold: 0,
        ComparisonOperator: 'GreaterThanThreshold',
        TreatMissingData: 'notBreaching',
      }),
    };
  }

  const alarmLogicalIds = Object.keys(resources).filter((id) => id !== ALARM_TOPIC_LOGICAL_ID);
  const subscribed = subscriptionOf(subscription);
  if (subscribed) {
    resources.AlarmSubscription = {
      Type: 'AWS::SNS::Subscription',
      // An email subscriber confirms once from the mail SNS sends; an HTTPS endpoint must answer
      // SNS's SubscriptionConfirmation request.
      Properties: { TopicArn: { Ref: ALARM_TOPIC_LOGICAL_ID }, ...subscribed },
    };
  }
  const outputs = {
    AlarmTopicArn: {
      Description: 'Subscribe on-call to this topic: every alarm of the stage notifies it',
      Value: { Ref: ALARM_TOPIC_LOGICAL_ID },
    },
  };
  return { resources, outputs, alarmLogicalIds };
}

module.exports = {
  alarmResources,
  subscriptionOf,
  ALARM_TOPIC_LOGICAL_ID,
  SWEEPER_FUNCTION_DIMENSION,
  RECLAIMER_FUNCTION_DIMENSION,
};
