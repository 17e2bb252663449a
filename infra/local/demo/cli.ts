/**
 * `npm start [-- options]`: see HELP_TEXT (`npm start -- --help`). Ctrl-C stops the demo in order
 * and exits 130 once nothing it started is left running; a second Ctrl-C exits at once.
 *
 * In a terminal, Ctrl-C reaches the whole foreground process group: this process, but also the
 * sandbox processes and embedded PostgreSQL, which start to exit on their own. The orderly stop
 * copes with that (see onUncaught and database.ts).
 */

import { ConfigError } from '../../../functions/adapters/errors.ts';
import { redactSecrets } from '../../../functions/adapters/redact.ts';
import { startupFailureText } from '../errors.ts';
import { runDemo } from './demo.ts';
import { PlatformMessage } from './lines.ts';
import { HELP_TEXT, parseCommandLine } from './options.ts';
import { platformLog } from './platform-log.ts';
import { ExitCode } from './summary.ts';

async function main(): Promise<number> {
  const parsed = parseCommandLine(process.argv.slice(2));
  if (parsed.kind === 'help') {
    process.stdout.write(HELP_TEXT);
    return ExitCode.OK;
  }
  if (parsed.kind === 'invalid') {
    process.stderr.write(`npm start: ${parsed.message}\n`);
    return ExitCode.USAGE;
  }
  const stop = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    if (stop.signal.aborted) {
      process.stderr.write(`\n${signal} again: exiting without waiting for the cleanup to finish\n`);
      process.exit(ExitCode.INTERRUPTED);
    }
    stop.abort(signal);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  // An error nobody handled (e.g. a database connection dropped between two statements of a
  // transaction) stops the demo like Ctrl-C does, so the sandboxes and PostgreSQL are still
  // stopped in order, and the demo fails with the error as its reason. Later ones (PostgreSQL
  // going away under the stack while it stops) are only logged.
  const onUncaught = (error: unknown) => {
    const cause = error instanceof Error ? error : new Error(String(error));
    if (!stop.signal.aborted) stop.abort(cause);
    platformLog(
      PlatformMessage.STACK_ERROR,
      { source: 'process', error: redactSecrets(cause.stack ?? cause.message) },
      stop.signal.reason === cause ? 'ERROR' : 'WARN',
    );
  };
  process.on('uncaughtException', onUncaught);
  process.on('unhandledRejection', onUncaught);
  const summary = await runDemo(parsed.options, { signal: stop.signal });
  return summary.exitCode;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    if (error instanceof ConfigError) {
      process.stderr.write(`npm start: ${error.message}\n`);
      process.exit(ExitCode.USAGE);
    }
    process.stderr.write(`npm start failed: ${redactSecrets(startupFailureText(error))}\n`);
    process.exit(ExitCode.NOT_CONVERGED);
  },
);
