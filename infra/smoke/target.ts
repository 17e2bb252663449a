/**
 * What a smoke check runs against: a stage's queues (its prefix), its SQS endpoint, its database
 * and, when this machine can reach it, its provisioner. The local stage defaults to the
 * LocalStack environment (infra/localstack/topology.ts); any other stage is a real AWS account,
 * reached with the SDK's own credentials and region. Every part can be pointed elsewhere with the
 * same variables the operator CLI reads — which is how the smoke check runs against
 * `npm run stack` (base queue names: QUEUE_NAME_PREFIX empty) and against the test suite's stacks.
 */
import { LOCAL_STAGE, LOCALSTACK, POSTGRES_HOST_URL, PROVISIONER } from '../localstack/topology.ts';
import { SmokeUsageError } from './errors.ts';

type Env = Readonly<Record<string, string | undefined>>;

export interface SmokeTarget {
  stage: string;
  /** Deployed queue names: `<stage>-<base name>`; QUEUE_NAME_PREFIX overrides, empty included. */
  queueNamePrefix: string;
  /** Undefined: AWS itself. */
  sqsEndpoint: string | undefined;
  databaseUrl: string;
  /** Undefined: the sandbox is only recorded, never created (the DELETE then finds it gone). */
  provisionerUrl: string | undefined;
}

const STAGE_NAME = /^[a-zA-Z0-9-]{1,32}$/;

export function smokeTarget(stage: string, env: Env): SmokeTarget {
  if (!STAGE_NAME.test(stage)) {
    throw new SmokeUsageError(`--stage "${stage}" is not a stage name (letters, digits and -, at most 32)`);
  }
  const local = stage === LOCAL_STAGE;
  const databaseUrl = env.DATABASE_URL?.trim() || (local ? POSTGRES_HOST_URL : undefined);
  if (!databaseUrl) {
    throw new SmokeUsageError(
      `DATABASE_URL is required for stage ${stage}: export it from its parameter first (aws ssm get-parameter --with-decryption --name /runtime-cleanup/${stage}/database-url --query Parameter.Value --output text)`,
    );
  }
  return {
    stage,
    queueNamePrefix: env.QUEUE_NAME_PREFIX !== undefined ? env.QUEUE_NAME_PREFIX.trim() : `${stage}-`,
    sqsEndpoint:
      env.AWS_ENDPOINT_URL_SQS?.trim() ||
      env.AWS_ENDPOINT_URL?.trim() ||
      (local ? LOCALSTACK.hostEndpoint : undefined),
    databaseUrl,
    provisionerUrl: env.SANDBOX_PROVISIONER_URL?.trim() || (local ? PROVISIONER.hostUrl : undefined),
  };
}
