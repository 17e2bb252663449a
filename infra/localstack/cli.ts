/**
 * `npm run deploy:local` and `npm run remove:local`: the local stage of serverless.yml, deployed
 * into (or removed from) the LocalStack that infra/localstack/compose.yml starts. docs/localstack.md
 * walks through it.
 *
 * deploy: checks that LocalStack answers with every service the stage needs, puts the provisioner's
 * URL into LocalStack's SSM (CloudFormation resolves it into the functions' environment at deploy
 * time), applies the migrations to the compose PostgreSQL, runs `osls deploy --stage local`, then
 * puts the database URL as a SecureString under the key the stack just created (the functions
 * read it at cold start). The URLs in SSM are the ones the Lambda containers use, on the compose
 * network; the migrations run from this machine, through the published port.
 *
 * remove: `osls remove --stage local`, then the two parameters. The retained resources (the DLQs,
 * the keys) stay until LocalStack restarts: it keeps no state across restarts.
 */
import { spawn } from 'node:child_process';
import { DeleteParameterCommand, PutParameterCommand, SSMClient } from '@aws-sdk/client-ssm';
import { boundedAwsClientOptions } from '../../functions/adapters/aws-clients.ts';
import { redactUrl } from '../../functions/adapters/config.ts';
import { redactSecrets } from '../../functions/adapters/redact.ts';
import { LocalStackEmulatorError, LocalStageStepError } from './errors.ts';
import { checkLocalStack } from './health.ts';
import {
  LOCAL_STAGE,
  LOCALSTACK,
  LOCALSTACK_CREDENTIALS,
  LOCALSTACK_REGION,
  POSTGRES_HOST_URL,
  POSTGRES_LAMBDA_URL,
  PROVISIONER,
} from './topology.ts';

const PARAMETERS = {
  databaseUrl: `/runtime-cleanup/${LOCAL_STAGE}/database-url`,
  provisionerUrl: `/runtime-cleanup/${LOCAL_STAGE}/sandbox-provisioner-url`,
};
const DATABASE_URL_KEY_ALIAS = `alias/runtime-cleanup-${LOCAL_STAGE}-database-url`;

const USAGE = `Usage: npm run deploy:local | npm run remove:local

deploy:local  deploys serverless.yml's local stage into LocalStack: the provisioner URL and the
              database URL in its SSM, the migrations applied to the compose PostgreSQL, the
              packaged functions with their queues, mappings, schedules, roles and alarms.
remove:local  removes the stack and the two parameters again.

Needs Docker and the compose file running: docker compose -f infra/localstack/compose.yml up -d
Variables: AWS_ENDPOINT_URL (LocalStack, default ${LOCALSTACK.hostEndpoint}); DATABASE_URL (the
database the migrations go to, default the compose PostgreSQL, ${redactUrl(POSTGRES_HOST_URL)}).
Exit status: 0 done, 1 failed (the reason is the last line), 2 usage error.`;

type Env = Readonly<Record<string, string | undefined>>;

function log(message: string): void {
  console.log(`deploy:local: ${message}`);
}

/** Runs a project command with its output on this terminal; a failure stops the deployment. */
function run(step: string, command: string, args: string[], env: Env): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: 'inherit', env: { ...process.env, ...env } });
    child.on('error', (error) =>
      reject(new LocalStageStepError(`${step} could not start: ${error.message}`)),
    );
    child.on('exit', (code, signal) => {
      if (code === 0) resolve();
      else
        reject(new LocalStageStepError(`${step} failed (${signal ?? `exit ${code}`}); its reason is above`));
    });
  });
}

function ssmClient(endpoint: string): SSMClient {
  return new SSMClient({
    ...boundedAwsClientOptions(),
    endpoint,
    region: LOCALSTACK_REGION,
    credentials: { ...LOCALSTACK_CREDENTIALS },
  });
}

/** What osls needs to deploy into LocalStack (infra/localstack/osls-plugin.cjs reads AWS_ENDPOINT_URL). */
function oslsEnvironment(endpoint: string): Env {
  return { AWS_ENDPOINT_URL: endpoint };
}

async function deploy(env: Env): Promise<void> {
  const endpoint = env.AWS_ENDPOINT_URL || LOCALSTACK.hostEndpoint;
  const health = await checkLocalStack(endpoint);
  log(`LocalStack ${health.version ?? '(version not reported)'} answers at ${endpoint}`);
  const ssm = ssmClient(endpoint);
  try {
    await ssm.send(
      new PutParameterCommand({
        Name: PARAMETERS.provisionerUrl,
        Type: 'String',
        Value: PROVISIONER.lambdaUrl,
        Overwrite: true,
      }),
    );
    log(`${PARAMETERS.provisionerUrl} = ${PROVISIONER.lambdaUrl} (the provisioner on the compose network)`);
    const migrationUrl = env.DATABASE_URL || POSTGRES_HOST_URL;
    log(`applying the migrations to ${redactUrl(migrationUrl)}`);
    await run('npm run migrate', 'npm', ['run', '--silent', 'migrate'], { DATABASE_URL: migrationUrl });
    log('osls deploy --stage local');
    await run(
      'osls deploy',
      'npm',
      ['exec', '--', 'osls', 'deploy', '--stage', LOCAL_STAGE],
      oslsEnvironment(endpoint),
    );
    await ssm.send(
      new PutParameterCommand({
        Name: PARAMETERS.databaseUrl,
        Type: 'SecureString',
        KeyId: DATABASE_URL_KEY_ALIAS,
        Value: POSTGRES_LAMBDA_URL,
        Overwrite: true,
      }),
    );
    log(
      `${PARAMETERS.databaseUrl} = ${redactUrl(POSTGRES_LAMBDA_URL)} (SecureString under ${DATABASE_URL_KEY_ALIAS})`,
    );
    log('deployed; check it with `npm run smoke`');
  } finally {
    ssm.destroy();
  }
}

async function remove(env: Env): Promise<void> {
  const endpoint = env.AWS_ENDPOINT_URL || LOCALSTACK.hostEndpoint;
  await checkLocalStack(endpoint);
  await run(
    'osls remove',
    'npm',
    ['exec', '--', 'osls', 'remove', '--stage', LOCAL_STAGE],
    oslsEnvironment(endpoint),
  );
  const ssm = ssmClient(endpoint);
  try {
    for (const name of Object.values(PARAMETERS)) {
      await ssm.send(new DeleteParameterCommand({ Name: name })).catch((error: Error) => {
        if (error.name !== 'ParameterNotFound') throw error;
      });
    }
  } finally {
    ssm.destroy();
  }
  console.log('remove:local: removed (the retained DLQs and keys go when LocalStack restarts)');
}

async function main(argv: readonly string[]): Promise<void> {
  const [command, ...rest] = argv;
  if (command === '--help' || command === '-h' || rest.includes('--help') || rest.includes('-h')) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  if ((command !== 'deploy' && command !== 'remove') || rest.length) {
    process.stderr.write(
      `infra/localstack/cli.ts: expected deploy or remove, got ${JSON.stringify(argv)}\n\n${USAGE}\n`,
    );
    process.exitCode = 2;
    return;
  }
  await (command === 'deploy' ? deploy(process.env) : remove(process.env));
}

main(process.argv.slice(2)).catch((error: unknown) => {
  const message =
    error instanceof LocalStackEmulatorError
      ? error.message
      : redactSecrets((error as Error)?.stack ?? String(error));
  console.error(`${process.argv[2] === 'remove' ? 'remove' : 'deploy'}:local failed: ${message}`);
  process.exit(1);
});
