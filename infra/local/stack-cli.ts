/**
 * `npm run stack`: the local stack in the foreground. Logs one JSON line whose message is
 * `stack ready` once every consumer polls; SIGINT/SIGTERM stop it cleanly (consumers drained,
 * sandboxes killed, emulator and database closed).
 */
import { redactUrl } from '../../functions/adapters/config.ts';
import { ConfigError } from '../../functions/adapters/errors.ts';
import { redactSecrets } from '../../functions/adapters/redact.ts';
import { acceptNoOptionCommandLine } from '../command-line.ts';
import { startStack } from './stack.ts';
import { describeStartFailure } from './start-failure.ts';

function log(level: 'INFO' | 'ERROR', message: string, extra: Record<string, unknown> = {}): void {
  const line = JSON.stringify({
    level,
    message,
    service: 'runtime-cleanup',
    function: 'stack',
    timestamp: new Date().toISOString(),
    ...extra,
  });
  if (level === 'ERROR') console.error(line);
  else console.log(line);
}

const USAGE = `Usage: npm run stack [-- --help]

Runs the local stack in the foreground: the SQS emulator on 127.0.0.1:4566 with every queue (or
the endpoint AWS_ENDPOINT_URL_SQS names), the functions and the sweeper consuming them, the
migrations applied to DATABASE_URL (embedded PostgreSQL when unset), and the built-in provisioner
unless SANDBOX_PROVISIONER_URL names one. Logs a JSON line with "message":"stack ready" once every
consumer polls; SIGINT/SIGTERM stop it. Takes no options; configure it with the variables in
docs/integration.md, section 4 ("Configuration").
Exit status: 0 stopped cleanly, 1 failed to start, 2 usage error.`;

async function main(): Promise<void> {
  if (!acceptNoOptionCommandLine('npm run stack', USAGE, process.argv.slice(2))) return;
  const stack = await startStack({
    onError: (error, source) =>
      log('ERROR', 'stack component error', { source, error: redactSecrets(error.message) }),
  });
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) {
      log('INFO', 'second signal: exiting without waiting for the stop to finish', { signal });
      process.exit(130);
    }
    stopping = true;
    log('INFO', 'stack stopping', {
      signal,
      note: 'provisioner DELETEs still in flight are aborted, not waited for: their fences stay up and their cleanups resume when the stack runs again',
    });
    await stack.stop();
    log('INFO', 'stack stopped');
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
  log('INFO', 'stack ready', {
    sqsEndpoint: stack.sqsEndpoint,
    queues: [...stack.createdQueues.values()].map((queue) => queue.url),
    databaseUrl: redactUrl(stack.databaseUrl),
    databaseDriver: stack.databaseDriver,
    provisionerUrl: redactUrl(stack.provisionerUrl),
    builtInProvisioner: stack.provisioner !== undefined,
    sweepIntervalSeconds: stack.config.fenceSweepIntervalSeconds,
  });
}

main().catch((error: unknown) => {
  if (error instanceof ConfigError) {
    console.error(error.message);
  } else {
    console.error(`stack failed to start: ${describeStartFailure(error, process.env)}`);
  }
  process.exit(1);
});
