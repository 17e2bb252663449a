/**
 * `npm run smoke -- [--stage NAME] [--timeout-seconds N]`: the post-deploy smoke check
 * (smoke.ts) against a deployed stage. Exit status: 0 passed, 1 failed (the last line says why and
 * where to look), 2 bad usage or configuration, 3 database or SQS unreachable, 5 a bug.
 */
import { parseArgs } from 'node:util';
import { redactSecrets } from '../../functions/adapters/redact.ts';
import { LOCAL_STAGE } from '../localstack/topology.ts';
import { ExitCode } from '../ops/exit-codes.ts';
import { describeFailure } from '../ops/failure.ts';
import { SmokeCheckFailedError, SmokeUsageError } from './errors.ts';
import { runSmokeCheck } from './smoke.ts';
import { smokeTarget } from './target.ts';

const DEFAULT_TIMEOUT_SECONDS = 300;

const USAGE = `Usage: npm run smoke -- [--stage NAME] [--timeout-seconds N]

Records a conversation, a sandbox and a finished root run with its fence in the stage's
database, announces the run on its run-finished queue, and waits for the run's runtime-cleaned
event; then checks that the fence is down and the sandbox gone. The same check after every deploy.

  --stage NAME          the stage (default ${LOCAL_STAGE}: the LocalStack environment, docs/localstack.md);
                        any other stage is a real AWS account (the SDK's credentials and region)
  --timeout-seconds N   how long to wait for runtime-cleaned (default ${DEFAULT_TIMEOUT_SECONDS})

Variables (each overrides the stage's default):
  DATABASE_URL            the stage's database (local: the compose PostgreSQL; others: required)
  SANDBOX_PROVISIONER_URL the provisioner as this machine reaches it (local: the compose one);
                          unset for another stage, the sandbox is only recorded, not created
  AWS_ENDPOINT_URL_SQS    the SQS endpoint (local: LocalStack on localhost:4566; others: AWS)
  QUEUE_NAME_PREFIX       the queue names' prefix (default "<stage>-"; empty for npm run stack)
Exit status: 0 passed, 1 failed, 2 bad usage or configuration, 3 database or SQS unreachable, 5 a bug.`;

function parse(argv: readonly string[]): { stage: string; timeoutMs: number } | 'help' {
  const { values } = parseArgs({
    args: [...argv],
    options: {
      stage: { type: 'string' },
      'timeout-seconds': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) return 'help';
  const timeout = values['timeout-seconds'] ?? String(DEFAULT_TIMEOUT_SECONDS);
  if (!/^\d+$/.test(timeout) || Number(timeout) < 1 || Number(timeout) > 3600) {
    throw new SmokeUsageError(
      `--timeout-seconds "${timeout}" must be a whole number of seconds from 1 to 3600`,
    );
  }
  return { stage: values.stage ?? LOCAL_STAGE, timeoutMs: Number(timeout) * 1000 };
}

async function main(): Promise<number> {
  let options: ReturnType<typeof parse>;
  try {
    options = parse(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`smoke: ${(error as Error).message}\n\n${USAGE}\n`);
    return ExitCode.USAGE;
  }
  if (options === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return ExitCode.OK;
  }
  const log = (line: string) => console.log(`smoke: ${redactSecrets(line)}`);
  try {
    const target = smokeTarget(options.stage, process.env);
    const result = await runSmokeCheck(target, { env: process.env, timeoutMs: options.timeoutMs, log });
    log(
      `passed: run ${result.runId} cleaned in ${(result.cleanedAfterMs / 1000).toFixed(1)} s, generation ${result.generation} of sandbox ${result.sandboxId} ${result.createdAtProvisioner ? 'deleted at the provisioner' : 'released (recorded only)'}${result.handedBack ? `; ${result.handedBack} other runtime-cleaned message(s) handed back` : ''}`,
    );
    return ExitCode.OK;
  } catch (error) {
    if (error instanceof SmokeUsageError) {
      console.error(`smoke: ${error.message}`);
      return ExitCode.USAGE;
    }
    if (error instanceof SmokeCheckFailedError) {
      console.error(`smoke: FAILED: ${redactSecrets(error.message)}`);
      return 1;
    }
    const failure = describeFailure(error);
    console.error(`smoke: ${failure.code}: ${failure.message}`);
    return failure.exitCode;
  }
}

main().then((code) => process.exit(code));
