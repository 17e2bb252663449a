'use strict';

/**
 * One execution role per function, each naming exact queue ARNs. osls's default is one role for
 * the whole service, which would let the sweeper publish release commands and the release function
 * send to `runtime-cleaned`; a function given `role:` gets none of the service role's grants, so
 * each role here also carries its own log and event-source permissions.
 */
const { projectFacts } = require('./project.cjs');
const {
  deadLetterQueueLogicalId,
  functionRoleLogicalId,
  logGroupLogicalId,
  queueLogicalId,
} = require('./names.cjs');

/**
 * The queues each function sends to, by base name: the protocol's arrows (docs/integration.md,
 * section 2). A consumer may also send to its own queue's DLQ (batch.ts moves a message that can never
 * succeed there itself, with its reason) and gets that grant from `queues.json`, not from here.
 */
const SENDS = {
  // phase 1 → release | finalize, or a delayed re-check of itself (deferred)
  fenceCheck: ['runtime-release.fifo', 'runtime-finalize', 'run-finished'],
  // phase 2 → finalize, or back to phase 1 when a run is active in the scope again (release guard)
  release: ['runtime-finalize', 'run-finished'],
  // phase 3 → runtime-cleaned; identity changed → back to phase 1; deferred → re-check of itself
  finalize: ['runtime-cleaned', 'run-finished', 'runtime-finalize'],
  // fences pending too long → announced again
  sweeper: ['run-finished'],
};

/** What the Lambda event source needs, plus ChangeMessageVisibility for the retry backoff (batch.ts). */
const CONSUME_ACTIONS = [
  'sqs:ReceiveMessage',
  'sqs:DeleteMessage',
  'sqs:ChangeMessageVisibility',
  'sqs:GetQueueAttributes',
  // queues.ts resolves every URL by name, the consumed queue's included (for ChangeMessageVisibility).
  'sqs:GetQueueUrl',
];
const SEND_ACTIONS = ['sqs:SendMessage', 'sqs:GetQueueUrl'];

const arnOf = (logicalId) => ({ 'Fn::GetAtt': [logicalId, 'Arn'] });

/**
 * What each function may do, as data: tests and the role generator read the same table.
 * @returns {Record<string, { consumes: string[], sendsTo: string[] }>} queue base names per function
 */
function functionGrants() {
  const { QUEUE_DEFINITIONS, FUNCTION_DEFINITIONS, deadLetterQueueName } = projectFacts();
  const grants = {};
  for (const functionKey of Object.keys(FUNCTION_DEFINITIONS)) {
    const sendsTo = SENDS[functionKey];
    if (!sendsTo) throw new Error(`infra/serverless/iam.cjs: no SENDS entry for function "${functionKey}"`);
    const consumes = Object.entries(QUEUE_DEFINITIONS)
      .filter(([, definition]) => definition.consumer === functionKey)
      .map(([name]) => name);
    grants[functionKey] = {
      consumes,
      sendsTo: [...sendsTo, ...consumes.map((name) => deadLetterQueueName(name))],
    };
  }
  return grants;
}

/** `runtime-release-dlq.fifo` → the logical ID of the DLQ resource; a plain name → its queue's. */
function queueArnByName(name) {
  const { QUEUE_DEFINITIONS, deadLetterQueueName } = projectFacts();
  if (QUEUE_DEFINITIONS[name]) return arnOf(queueLogicalId(name));
  const source = Object.keys(QUEUE_DEFINITIONS).find((queue) => deadLetterQueueName(queue) === name);
  if (!source) throw new Error(`infra/serverless/iam.cjs: unknown queue "${name}"`);
  return arnOf(deadLetterQueueLogicalId(source));
}

/** @returns {Record<string, object>} an AWS::IAM::Role per function */
function functionRoles() {
  const resources = {};
  for (const [functionKey, { consumes, sendsTo }] of Object.entries(functionGrants())) {
    const statements = [
      {
        Sid: 'WriteOwnLogs',
        Effect: 'Allow',
        Action: ['logs:CreateLogStream', 'logs:PutLogEvents'],
        // The log group's ARN ends in `:*`, which covers its streams. osls creates the group.
        Resource: [arnOf(logGroupLogicalId(functionKey))],
      },
    ];
    if (consumes.length) {
      statements.push({
        Sid: 'ConsumeOwnQueue',
        Effect: 'Allow',
        Action: CONSUME_ACTIONS,
        Resource: consumes.map(queueArnByName),
      });
    }
    statements.push({
      Sid: 'SendToNextQueues',
      Effect: 'Allow',
      Action: SEND_ACTIONS,
      Resource: sendsTo.map(queueArnByName),
    });
    resources[functionRoleLogicalId(functionKey)] = {
      Type: 'AWS::IAM::Role',
      Properties: {
        AssumeRolePolicyDocument: {
          Version: '2012-10-17',
          Statement: [
            { Effect: 'Allow', Principal: { Service: 'lambda.amazonaws.com' }, Action: 'sts:AssumeRole' },
          ],
        },
        // Metrics go out as EMF log lines (Powertools), so no cloudwatch:PutMetricData.
        Policies: [
          {
            PolicyName: `${functionKey}-least-privilege`,
            PolicyDocument: { Version: '2012-10-17', Statement: statements },
          },
        ],
      },
    };
  }
  return resources;
}

module.exports = { functionRoles, functionGrants, SENDS };
