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
  // sends to no queue: it lists and deletes at the provisioner and reads and writes the database
  reclaimer: [],
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

/** The KMS key that encrypts the database URL's SecureString parameter, and its alias. */
const DATABASE_URL_KEY = 'DatabaseUrlKey';
const DATABASE_URL_KEY_ALIAS = 'DatabaseUrlKeyAlias';

/** `/runtime-cleanup/prod/database-url` → its ARN (SSM puts the name, leading slash included, after `parameter`). */
function parameterArn(name) {
  const path = name.startsWith('/') ? name : `/${name}`;
  return { 'Fn::Sub': `arn:\${AWS::Partition}:ssm:\${AWS::Region}:\${AWS::AccountId}:parameter${path}` };
}

/**
 * A customer-managed key for the database URL, so that decrypting it takes a grant on this key:
 * with SSM's AWS-managed key (aws/ssm) any principal of the account allowed to read the parameter
 * could decrypt it too, and a role's kms:Decrypt could not name one key. The key policy only hands
 * administration to the account's IAM (AWS's default); the function roles get kms:Decrypt on it,
 * through SSM only and for this one parameter only (iam statements below).
 *
 * Retained when the stack is deleted or the key replaced: the parameter stays encrypted under it,
 * and deleting the only key that can decrypt it would make the credentials unrecoverable.
 *
 * @param {{ stage: string, service: string, databaseUrlParameter: string }} options
 */
function databaseUrlKeyResources({ stage, service, databaseUrlParameter }) {
  const alias = `alias/${service}-${stage}-database-url`;
  return {
    resources: {
      [DATABASE_URL_KEY]: {
        Type: 'AWS::KMS::Key',
        DeletionPolicy: 'Retain',
        UpdateReplacePolicy: 'Retain',
        Properties: {
          Description: `Encrypts the SSM SecureString ${databaseUrlParameter} (${service} ${stage})`,
          EnableKeyRotation: true,
          KeyPolicy: {
            Version: '2012-10-17',
            Statement: [
              {
                Sid: 'AccountAdministersThroughIam',
                Effect: 'Allow',
                Principal: { AWS: { 'Fn::Sub': `arn:\${AWS::Partition}:iam::\${AWS::AccountId}:root` } },
                Action: 'kms:*',
                Resource: '*',
              },
            ],
          },
        },
      },
      [DATABASE_URL_KEY_ALIAS]: {
        Type: 'AWS::KMS::Alias',
        Properties: { AliasName: alias, TargetKeyId: { Ref: DATABASE_URL_KEY } },
      },
    },
    outputs: {
      DatabaseUrlParameterName: {
        Description: `Put the database URL here as a SecureString under ${alias} (see README, Deploying)`,
        Value: databaseUrlParameter,
      },
      DatabaseUrlKeyAlias: { Description: 'The KMS key of the database URL parameter', Value: alias },
    },
  };
}

/** The two statements every function needs to read the database URL at cold start, and nothing more. */
function readDatabaseUrlStatements(databaseUrlParameter) {
  const arn = parameterArn(databaseUrlParameter);
  return [
    {
      Sid: 'ReadDatabaseUrl',
      Effect: 'Allow',
      Action: ['ssm:GetParameter'],
      Resource: [arn],
    },
    {
      Sid: 'DecryptDatabaseUrlThroughSsm',
      Effect: 'Allow',
      Action: ['kms:Decrypt'],
      Resource: [arnOf(DATABASE_URL_KEY)],
      Condition: {
        StringEquals: {
          'kms:ViaService': { 'Fn::Sub': `ssm.\${AWS::Region}.amazonaws.com` },
          // SSM encrypts a SecureString with its ARN as encryption context.
          'kms:EncryptionContext:PARAMETER_ARN': arn,
        },
      },
    },
  ];
}

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

/**
 * @param {{ databaseUrlParameter: string }} options the SSM parameter holding the database URL
 * @returns {Record<string, object>} an AWS::IAM::Role per function
 */
function functionRoles({ databaseUrlParameter }) {
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
    if (sendsTo.length) {
      statements.push({
        Sid: 'SendToNextQueues',
        Effect: 'Allow',
        Action: SEND_ACTIONS,
        Resource: sendsTo.map(queueArnByName),
      });
    }
    // Every function uses the database.
    statements.push(...readDatabaseUrlStatements(databaseUrlParameter));
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

module.exports = {
  functionRoles,
  functionGrants,
  databaseUrlKeyResources,
  parameterArn,
  SENDS,
  DATABASE_URL_KEY,
};
