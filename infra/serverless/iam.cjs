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

/**
 * The functions that call the sandbox provisioner (release deletes, the reclaimer lists and
 * deletes): they alone get its URL and, when the stage enables it, its bearer token.
 */
const PROVISIONER_CALLERS = ['release', 'reclaimer'];

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
 * The SecureString parameters the functions read at cold start, by the name that prefixes their
 * key's logical IDs and outputs. `DatabaseUrlKey` must never change: a renamed key is a new key,
 * and the parameter stays encrypted under the old one.
 */
const SECURE_PARAMETERS = { DATABASE_URL: 'DatabaseUrl', PROVISIONER_TOKEN: 'ProvisionerToken' };
const keyLogicalId = (name) => `${name}Key`;
const DATABASE_URL_KEY = keyLogicalId(SECURE_PARAMETERS.DATABASE_URL);

/** `/runtime-cleanup/prod/database-url` → its ARN (SSM puts the name, leading slash included, after `parameter`). */
function parameterArn(name) {
  const path = name.startsWith('/') ? name : `/${name}`;
  return { 'Fn::Sub': `arn:\${AWS::Partition}:ssm:\${AWS::Region}:\${AWS::AccountId}:parameter${path}` };
}

/** `sandbox-provisioner-token` from `/runtime-cleanup/prod/sandbox-provisioner-token`. */
const parameterBaseName = (parameter) => parameter.split('/').filter(Boolean).pop();

/**
 * A customer-managed key for one SecureString parameter (the database URL; the provisioner's
 * token when the stage enables it), so that decrypting it takes a grant on this key: with SSM's
 * AWS-managed key (aws/ssm) any principal of the account allowed to read the parameter could
 * decrypt it too, and a role's kms:Decrypt could not name one key. The key policy only hands
 * administration to the account's IAM (AWS's default); the function roles get kms:Decrypt on it,
 * through SSM only and for this one parameter only (readSecureParameterStatements below).
 *
 * Retained when the stack is deleted or the key replaced: the parameter stays encrypted under it,
 * and deleting the only key that can decrypt it would make the secret unrecoverable.
 *
 * @param {{ name: string, parameter: string, what: string, stage: string, service: string }} options
 *   `name` prefixes the logical IDs and outputs (`DatabaseUrl` → DatabaseUrlKey, DatabaseUrlKeyAlias,
 *   outputs DatabaseUrlParameterName and DatabaseUrlKeyAlias); `what` names the secret in descriptions.
 */
function secureParameterKeyResources({ name, parameter, what, stage, service }) {
  const alias = `alias/${service}-${stage}-${parameterBaseName(parameter)}`;
  return {
    resources: {
      [keyLogicalId(name)]: {
        Type: 'AWS::KMS::Key',
        DeletionPolicy: 'Retain',
        UpdateReplacePolicy: 'Retain',
        Properties: {
          Description: `Encrypts the SSM SecureString ${parameter} (${service} ${stage})`,
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
      [`${name}KeyAlias`]: {
        Type: 'AWS::KMS::Alias',
        Properties: { AliasName: alias, TargetKeyId: { Ref: keyLogicalId(name) } },
      },
    },
    outputs: {
      [`${name}ParameterName`]: {
        Description: `Put ${what} here as a SecureString under ${alias} (docs/deploying.md)`,
        Value: parameter,
      },
      [`${name}KeyAlias`]: { Description: `The KMS key of the ${what} parameter`, Value: alias },
    },
  };
}

/**
 * The two statements a function needs to read one SecureString at cold start, and nothing more:
 * GetParameter on its ARN, Decrypt on its key only through SSM and only for that parameter.
 *
 * @param {{ name: string, parameter: string }} options `name` (SECURE_PARAMETERS): `DatabaseUrl` →
 *   statements `ReadDatabaseUrl` and `DecryptDatabaseUrlThroughSsm`, on key `DatabaseUrlKey`
 */
function readSecureParameterStatements({ name, parameter }) {
  const arn = parameterArn(parameter);
  return [
    {
      Sid: `Read${name}`,
      Effect: 'Allow',
      Action: ['ssm:GetParameter'],
      Resource: [arn],
    },
    {
      Sid: `Decrypt${name}ThroughSsm`,
      Effect: 'Allow',
      Action: ['kms:Decrypt'],
      Resource: [arnOf(keyLogicalId(name))],
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
 * What a function in a private network needs so that Lambda can attach it to the stage's subnets:
 * the EC2 actions of AWS's AWSLambdaVPCAccessExecutionRole (v3) and no others (its log actions
 * are granted per log group above). The two Describe actions support no resource-level
 * permissions, so they name `*`; the four that create, delete and address network interfaces are
 * held to this account and region, the form AWS's Lambda guide gives (naming narrower resources
 * for DeleteNetworkInterface can leave a function unable to reach the VPC).
 */
function privateNetworkStatements() {
  return [
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
 * @param {{ databaseUrlParameter: string, provisionerTokenParameter?: string, privateNetwork: boolean }} options
 *   the SSM parameters holding the database URL and (optional) the provisioner's token; whether
 *   the functions run in the stage's private network
 * @returns {Record<string, object>} an AWS::IAM::Role per function
 */
function functionRoles({ databaseUrlParameter, provisionerTokenParameter, privateNetwork }) {
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
    statements.push(
      ...readSecureParameterStatements({
        name: SECURE_PARAMETERS.DATABASE_URL,
        parameter: databaseUrlParameter,
      }),
    );
    if (provisionerTokenParameter && PROVISIONER_CALLERS.includes(functionKey)) {
      statements.push(
        ...readSecureParameterStatements({
          name: SECURE_PARAMETERS.PROVISIONER_TOKEN,
          parameter: provisionerTokenParameter,
        }),
      );
    }
    if (privateNetwork) statements.push(...privateNetworkStatements());
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

const PLATFORM_WORKER_POLICY = 'PlatformWorkerPolicy';

/**
 * The policy the agent platform attaches to its worker's role (output PlatformWorkerPolicyArn):
 * announce finished runs on run-finished, consume runtime-cleaned, nothing else.
 *
 * - No sqs:GetQueueUrl: the worker takes the queue URLs from the stack outputs
 *   (RunFinishedQueueUrl, RuntimeCleanedQueueUrl) instead of resolving names.
 * - No sqs:GetQueueAttributes or ChangeMessageVisibility: sending, receiving and deleting need
 *   neither; a runtime-cleaned message the worker fails to handle comes back after the queue's
 *   visibility timeout. SendMessageBatch and DeleteMessageBatch are authorised by SendMessage and
 *   DeleteMessage.
 * - No KMS: the queues use SQS-managed encryption (queues.cjs), which needs no key permissions.
 * - No ManagedPolicyName: IAM names are global to the account, and the same stage deployed in a
 *   second region would collide with the first; CloudFormation names it after the stack.
 */
function platformWorkerPolicy({ stage, service }) {
  const { QueueName } = projectFacts();
  return {
    resources: {
      [PLATFORM_WORKER_POLICY]: {
        Type: 'AWS::IAM::ManagedPolicy',
        Properties: {
          Description: `For the agent platform's worker (${service} ${stage}): send to run-finished, receive and delete on runtime-cleaned`,
          PolicyDocument: {
            Version: '2012-10-17',
            Statement: [
              {
                Sid: 'AnnounceFinishedRuns',
                Effect: 'Allow',
                Action: ['sqs:SendMessage'],
                Resource: [queueArnByName(QueueName.RUN_FINISHED)],
              },
              {
                Sid: 'ConsumeRuntimeCleaned',
                Effect: 'Allow',
                Action: ['sqs:ReceiveMessage', 'sqs:DeleteMessage'],
                Resource: [queueArnByName(QueueName.RUNTIME_CLEANED)],
              },
            ],
          },
        },
      },
    },
    outputs: {
      PlatformWorkerPolicyArn: {
        Description:
          "Attach to the agent platform's worker role: send to run-finished, receive and delete on runtime-cleaned (docs/deploying.md)",
        Value: { Ref: PLATFORM_WORKER_POLICY },
      },
    },
  };
}

module.exports = {
  functionRoles,
  functionGrants,
  secureParameterKeyResources,
  platformWorkerPolicy,
  parameterArn,
  SENDS,
  PROVISIONER_CALLERS,
  SECURE_PARAMETERS,
  DATABASE_URL_KEY,
};
