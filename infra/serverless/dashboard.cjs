'use strict';

/**
 * One CloudWatch dashboard for the stage: the cleanup's own metrics (metric-names.ts) next to the
 * queues' depths and the functions' errors, with the alarms on top.
 *
 * The function metrics are graphed with SEARCH over their exact dimension set, so a series per
 * outcome / errorCode / queue appears without listing the values here. Every series carries the
 * default dimensions of observability.ts (`function`, `service`, `stage`); the table below adds
 * the per-emission ones (as documented beside each name in metric-names.ts).
 */
const { projectFacts } = require('./project.cjs');
const { deadLetterQueueLogicalId, functionLogicalId, queueLogicalId } = require('./names.cjs');
const { deadLetterQueues } = require('./queues.cjs');

const EXTRA_DIMENSIONS = {
  FenceCheckOutcome: ['outcome'],
  ReleaseSucceeded: ['outcome'],
  ReleaseFailed: ['errorCode'],
  ReleaseSkipped: ['reason'],
  ReleaseDuration: [],
  ReleaseLockWait: [],
  FinalizeOutcome: ['outcome'],
  CleanupLatency: [],
  DeadLettered: ['queue', 'reason'],
  RetryScheduled: ['queue', 'errorCode'],
  PendingFences: [],
  OldestFenceAge: [],
  FencesReannounced: [],
  ForcedClears: [],
  RecordsReceived: [],
  SandboxesListed: [],
  SandboxesLeaked: [],
  SandboxesReclaimed: ['reason'],
  ReclaimRefused: ['reason'],
  ReclaimBrakeLifted: ['brake'],
  OldestLeakAge: [],
  ProvisionerUrlUnverified: [],
};

const WIDTH = 24;

/**
 * @param {{ stage: string, service: string, alarmLogicalIds: string[] }} options
 * @returns {Record<string, object>} the AWS::CloudWatch::Dashboard resource
 */
function dashboardResources({ stage, service, alarmLogicalIds }) {
  const { MetricName: M, METRICS_NAMESPACE, SERVICE_NAME, FUNCTION_DEFINITIONS } = projectFacts();
  const known = new Set(Object.values(M));
  for (const metric of known) {
    if (!(metric in EXTRA_DIMENSIONS)) {
      throw new Error(`infra/serverless/dashboard.cjs: metric ${metric} has no EXTRA_DIMENSIONS entry`);
    }
  }
  for (const metric of Object.keys(EXTRA_DIMENSIONS)) {
    if (!known.has(metric))
      throw new Error(`infra/serverless/dashboard.cjs: ${metric} is not in metric-names.ts`);
  }
  let nextId = 0;
  const search = (metric, stat, label) => {
    const schema = [
      METRICS_NAMESPACE,
      ...['function', ...EXTRA_DIMENSIONS[metric], 'service', 'stage'].sort(),
    ];
    nextId += 1;
    return {
      expression: `SEARCH('{${schema.join(',')}} MetricName="${metric}" service="${SERVICE_NAME}" stage="${stage}"', '${stat}', 60)`,
      id: `e${nextId}`,
      label,
    };
  };
  const graph = (title, metrics, extra = {}) => ({
    type: 'metric',
    width: 8,
    height: 6,
    properties: { title, region: `\${AWS::Region}`, view: 'timeSeries', stacked: false, metrics, ...extra },
  });
  const sqs = (metricName, queueLogical, label) => [
    'AWS/SQS',
    metricName,
    'QueueName',
    `\${${queueLogical}.QueueName}`,
    { label, stat: 'Maximum', period: 60 },
  ];
  const { QUEUE_DEFINITIONS } = projectFacts();
  const queueNames = Object.keys(QUEUE_DEFINITIONS);
  const lambda = (metricName, stat) =>
    Object.keys(FUNCTION_DEFINITIONS).map((key) => [
      'AWS/Lambda',
      metricName,
      'FunctionName',
      `\${${functionLogicalId(key)}}`,
      { label: key, stat, period: 60 },
    ]);

  const widgets = [
    {
      type: 'alarm',
      width: WIDTH,
      height: 3,
      properties: {
        title: 'Alarms (each description says what it means and what to do)',
        alarms: alarmLogicalIds.map((id) => `\${${id}.Arn}`),
      },
    },
    graph('Fence checks by outcome (phase 1)', [[search(M.FENCE_CHECK_OUTCOME, 'Sum', '')]]),
    graph('Releases: succeeded by outcome, failed by errorCode, skipped by reason (phase 2)', [
      [search(M.RELEASE_SUCCEEDED, 'Sum', 'succeeded')],
      [search(M.RELEASE_FAILED, 'Sum', 'failed')],
      [search(M.RELEASE_SKIPPED, 'Sum', 'skipped')],
    ]),
    graph('Finalize by outcome (phase 3)', [[search(M.FINALIZE_OUTCOME, 'Sum', '')]]),
    graph('Release duration (ms)', [
      [search(M.RELEASE_DURATION, 'p50', 'p50')],
      [search(M.RELEASE_DURATION, 'p99', 'p99')],
      [search(M.RELEASE_DURATION, 'Maximum', 'max')],
    ]),
    graph('Provider lock wait (ms)', [
      [search(M.RELEASE_LOCK_WAIT, 'p50', 'p50')],
      [search(M.RELEASE_LOCK_WAIT, 'p99', 'p99')],
      [search(M.RELEASE_LOCK_WAIT, 'Maximum', 'max')],
    ]),
    graph('Cleanup latency, fence set → cleared (ms)', [
      [search(M.CLEANUP_LATENCY, 'p50', 'p50')],
      [search(M.CLEANUP_LATENCY, 'p99', 'p99')],
      [search(M.CLEANUP_LATENCY, 'Maximum', 'max')],
    ]),
    graph('Pending fences', [[search(M.PENDING_FENCES, 'Maximum', 'pending')]]),
    graph('Oldest fence age (s)', [[search(M.OLDEST_FENCE_AGE, 'Maximum', 'oldest')]]),
    graph('Sweeper: re-announced fences, forced clears', [
      [search(M.FENCES_REANNOUNCED, 'Sum', 're-announced')],
      [search(M.FORCED_CLEARS, 'Sum', 'forced clears')],
    ]),
    graph('Reclaimer: sandboxes listed, leaked, reclaimed by why leaked', [
      [search(M.SANDBOXES_LISTED, 'Maximum', 'listed')],
      [search(M.SANDBOXES_LEAKED, 'Maximum', 'leaked')],
      [search(M.SANDBOXES_RECLAIMED, 'Sum', 'reclaimed')],
    ]),
    graph('Reclaimer: refused by reason (whole runs and single sandboxes)', [
      [search(M.RECLAIM_REFUSED, 'Sum', '')],
      [search(M.RECLAIM_BRAKE_LIFTED, 'Sum', 'brake lifted by pairing evidence')],
    ]),
    graph('Reclaimer: oldest open leak (s)', [[search(M.OLDEST_LEAK_AGE, 'Maximum', 'oldest leak')]]),
    graph('Deletes refused: SANDBOX_PROVISIONER_URL is not the provisioner', [
      [search(M.PROVISIONER_URL_UNVERIFIED, 'Sum', '')],
    ]),
    graph('Dead-lettered by queue and reason', [[search(M.DEAD_LETTERED, 'Sum', '')]]),
    graph('Retries scheduled by queue and errorCode', [[search(M.RETRY_SCHEDULED, 'Sum', '')]]),
    graph('Records per invocation', [[search(M.RECORDS_RECEIVED, 'Average', '')]]),
    graph(
      'Queue depth (visible messages)',
      queueNames.map((name) => sqs('ApproximateNumberOfMessagesVisible', queueLogicalId(name), name)),
    ),
    graph(
      'Dead-letter queue depth',
      deadLetterQueues().map(({ source, name }) =>
        sqs('ApproximateNumberOfMessagesVisible', deadLetterQueueLogicalId(source), name),
      ),
    ),
    graph(
      'Age of oldest message (s)',
      queueNames.map((name) => sqs('ApproximateAgeOfOldestMessage', queueLogicalId(name), name)),
    ),
    graph('Function errors', lambda('Errors', 'Sum')),
    graph('Function throttles', lambda('Throttles', 'Sum')),
    graph('Function duration p99 (ms)', lambda('Duration', 'p99')),
  ];

  return {
    Dashboard: {
      Type: 'AWS::CloudWatch::Dashboard',
      Properties: {
        DashboardName: `${service}-${stage}`,
        // Fn::Sub fills in the region, the queues' physical names, the function names and the
        // alarm ARNs; nothing else in the body uses `${`.
        DashboardBody: { 'Fn::Sub': JSON.stringify({ widgets }) },
      },
    },
  };
}

module.exports = { dashboardResources, EXTRA_DIMENSIONS };
