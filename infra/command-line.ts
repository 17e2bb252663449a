/**
 * The command line of the commands that take no options (`npm run migrate`, `npm run stack`):
 * `--help`/`-h` prints the usage on stdout and exits 0 before anything is touched; anything else
 * on the command line prints the usage on stderr and exits 2 — a typo must not be taken for
 * "go ahead" by a command that writes to a database or starts servers.
 */
import { parseArgs } from 'node:util';

export const USAGE_EXIT_CODE = 2;

export type CommandLine = { kind: 'run' } | { kind: 'help' } | { kind: 'invalid'; message: string };

export function parseNoOptionCommandLine(argv: readonly string[]): CommandLine {
  try {
    const parsed = parseArgs({
      args: [...argv],
      options: { help: { type: 'boolean', short: 'h' } },
      allowPositionals: false,
      strict: true,
    });
    return parsed.values.help ? { kind: 'help' } : { kind: 'run' };
  } catch (error) {
    return { kind: 'invalid', message: (error as Error).message };
  }
}

/**
 * Handles `--help` and bad arguments for the command named `name` (as typed: `npm run migrate`)
 * and returns true when the command should go on. Otherwise it has printed what to print and set
 * process.exitCode, and the caller returns without touching anything.
 */
export function acceptNoOptionCommandLine(name: string, usage: string, argv: readonly string[]): boolean {
  const line = parseNoOptionCommandLine(argv);
  if (line.kind === 'run') return true;
  if (line.kind === 'help') {
    process.stdout.write(`${usage.trimEnd()}\n`);
    process.exitCode = 0;
  } else {
    process.stderr.write(`${name}: ${line.message}\n\n${usage.trimEnd()}\n`);
    process.exitCode = USAGE_EXIT_CODE;
  }
  return false;
}
