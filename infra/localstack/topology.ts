/**
 * Where each part of the LocalStack development environment listens, seen from the developer's
 * machine (the deploy script, the smoke check, `npm run migrate`) and from the Lambda containers
 * LocalStack starts on the compose network. compose.yml publishes the same ports and names the
 * same services: test/unit/localstack-compose.test.ts holds them together.
 */

/** The compose file, from the project root. */
export const COMPOSE_FILE = 'infra/localstack/compose.yml';

/**
 * The Docker network of the compose project. LocalStack starts every Lambda container on it
 * (LAMBDA_DOCKER_NETWORK), so a function reaches the other services by their service names.
 */
export const COMPOSE_NETWORK = 'runtime-cleanup-localstack';

/** The stage serverless.yml deploys into LocalStack (infra/serverless/plugins.cjs). */
export const LOCAL_STAGE = 'local';

/** The local stage's region (serverless.yml params; LocalStack serves any, one at a time here). */
export const LOCALSTACK_REGION = 'us-east-1';

export const LOCALSTACK = {
  service: 'localstack',
  /** The gateway every AWS API of LocalStack answers on. */
  port: 4566,
  /** Where the deployer reaches it (AWS_ENDPOINT_URL overrides). */
  hostEndpoint: 'http://localhost:4566',
  /** Where the functions reach it: serverless.yml's params.local.awsEndpointUrl. */
  lambdaEndpoint: 'http://localstack:4566',
} as const;

export const POSTGRES = {
  service: 'postgres',
  user: 'postgres',
  password: 'postgres',
  database: 'runtime_cleanup',
  /** Published on 5433, beside a PostgreSQL the developer may run on 5432. */
  hostPort: 5433,
  port: 5432,
} as const;

export const PROVISIONER = {
  service: 'provisioner',
  port: 4599,
  hostUrl: 'http://127.0.0.1:4599',
  lambdaUrl: 'http://provisioner:4599',
} as const;

const postgresUrl = (host: string, port: number) =>
  `postgres://${POSTGRES.user}:${POSTGRES.password}@${host}:${port}/${POSTGRES.database}`;

/** The compose PostgreSQL, from the developer's machine (migrations, the smoke check, `npm run ops`). */
export const POSTGRES_HOST_URL = postgresUrl('127.0.0.1', POSTGRES.hostPort);
/** The same database from a Lambda container: what deploy:local puts into LocalStack's SSM. */
export const POSTGRES_LAMBDA_URL = postgresUrl(POSTGRES.service, POSTGRES.port);

/**
 * The AWS services the local stage's template and its deployment use, as LocalStack names them
 * (compose.yml's SERVICES): CloudFormation deploys the stack, S3 holds its artifacts, STS answers
 * who deploys; then what the template creates (functions, their roles and log groups, queues,
 * keys, parameters, schedules, alarms, the alarm topic, the dashboard).
 */
export const LOCALSTACK_SERVICES = [
  'cloudformation',
  'cloudwatch',
  'events',
  'iam',
  'kms',
  'lambda',
  'logs',
  's3',
  'scheduler',
  'sns',
  'sqs',
  'ssm',
  'sts',
] as const;

/** LocalStack's own test account's credentials: it accepts any, the SDK insists on some. */
export const LOCALSTACK_CREDENTIALS = { accessKeyId: 'test', secretAccessKey: 'test' } as const;
