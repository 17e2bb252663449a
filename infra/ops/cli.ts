/**
 * `npm run ops -- <command>` and the `runtime-cleanup-ops` bin (bin/runtime-cleanup-ops.mjs, which
 * runs this file's bundle): parses the command line, dispatches to one command module
 * (infra/ops/commands/), prints its output and exits with the documented code. Nothing else.
 */
import { Console } from 'node:console';
import { parseArgs } from 'node:util';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import type { Command, CommandInput, CommandOutput } from './command.ts';
import { COMMANDS } from './commands/index.ts';
import { createOpsContext, type OpsContext } from './context.ts';
import { OpsErrorCode, UsageError } from './errors.ts';
import { ExitCode } from './exit-codes.ts';
import { describeFailure, type Failure } from './failure.ts';
import { oneLine, printable, safeJson } from './format.ts';
import { renderCommandHelp, renderHelp } from './help.ts';

const GLOBAL_OPTIONS = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  stage: { type: 'string' },
} as const;

/** Global options that take a value: before the command, their value is not the command's name. */
const GLOBAL_VALUE_OPTIONS: ReadonlySet<string> = new Set(['--stage']);

type Invocation =
  | { kind: 'help'; command: Command | undefined; exitCode: ExitCode }
  | { kind: 'run'; command: Command; input: CommandInput; json: boolean; stage: string | undefined };

/** Where the command's name is: the first word that is neither an option nor an option's value. */
function commandIndex(argv: readonly string[]): number {
  for (let at = 0; at < argv.length; at += 1) {
    const arg = argv[at]!;
    if (GLOBAL_VALUE_OPTIONS.has(arg)) at += 1;
    else if (!arg.startsWith('-')) return at;
  }
  return -1;
}

function findCommand(name: string): Command {
  const command = COMMANDS.find((candidate) => candidate.name === name);
  if (!command) {
    throw new UsageError(
      `unknown command ${JSON.stringify(name)}; commands: ${COMMANDS.map((c) => c.name).join(', ')}, help`,
    );
  }
  return command;
}

function parseInvocation(argv: readonly string[]): Invocation {
  const at = commandIndex(argv);
  if (at === -1) {
    const asked = argv.includes('--help') || argv.includes('-h');
    if (!asked && argv.length) throw new UsageError(`a command is required before ${argv.join(' ')}`);
    // Bare `ops` is a usage error too: it prints the help, but a script must not read it as success.
    return { kind: 'help', command: undefined, exitCode: asked ? ExitCode.OK : ExitCode.USAGE };
  }
  const name = argv[at]!;
  const rest = [...argv.slice(0, at), ...argv.slice(at + 1)];
  if (name === 'help') {
    const topic = rest.find((arg) => !arg.startsWith('-'));
    return { kind: 'help', command: topic ? findCommand(topic) : undefined, exitCode: ExitCode.OK };
  }
  const command = findCommand(name);
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({
      args: rest,
      options: {
        ...GLOBAL_OPTIONS,
        ...Object.fromEntries(
          Object.entries(command.options).map(([key, spec]) => [
            key,
            { type: spec.type, ...(spec.short ? { short: spec.short } : {}) },
          ]),
        ),
      },
      allowPositionals: true,
      strict: true,
    });
  } catch (error) {
    throw new UsageError(`${(error as Error).message}; see: npm run ops -- help ${command.name}`);
  }
  if (parsed.values.help) return { kind: 'help', command, exitCode: ExitCode.OK };
  const required = command.arguments.filter((arg) => !arg.optional);
  if (parsed.positionals.length < required.length || parsed.positionals.length > command.arguments.length) {
    const expected = command.arguments.map((arg) => (arg.optional ? `[${arg.name}]` : `<${arg.name}>`));
    throw new UsageError(
      `${command.name} takes ${expected.length ? expected.join(' ') : 'no arguments'}, got ${
        parsed.positionals.length ? parsed.positionals.map((p) => JSON.stringify(p)).join(' ') : 'none'
      }`,
    );
  }
  return {
    kind: 'run',
    command,
    json: parsed.values.json === true,
    stage: typeof parsed.values.stage === 'string' ? parsed.values.stage : undefined,
    input: {
      positionals: parsed.positionals,
      options: parsed.values as CommandInput['options'],
    },
  };
}

/**
 * stdout carries only the command's output, so that `--json | jq` works. Every diagnostic line
 * goes to stderr: the global console is bound to it, and Powertools is put in dev mode so that
 * its WARN logs and EMF metric lines (force-clear's) go through that console instead of straight
 * to stdout. Dev mode would switch metrics off: they are switched on again unless told otherwise.
 */
function routeDiagnosticsToStderr(): void {
  globalThis.console = new Console({ stdout: process.stderr, stderr: process.stderr });
  process.env.POWERTOOLS_DEV = 'true';
  process.env.POWERTOOLS_METRICS_DISABLED ??= 'false';
}

/** Failures about the database DATABASE_URL names: the line names it (password redacted). */
const DATABASE_FAILURES: ReadonlySet<string> = new Set([
  InfrastructureErrorCode.DATABASE_UNAVAILABLE,
  OpsErrorCode.DATABASE_NOT_FOUND,
  OpsErrorCode.DATABASE_LOGIN_REFUSED,
  OpsErrorCode.DATABASE_READ_ONLY,
  OpsErrorCode.SCHEMA_NOT_MIGRATED,
]);

function failureLine(commandName: string, failure: Failure, context: OpsContext | undefined): string {
  // A bad value: exactly ConfigError's one line (variable, value, rule), as every entry point prints it.
  if (failure.code === InfrastructureErrorCode.CONFIG_INVALID) return oneLine(failure.message);
  const where =
    DATABASE_FAILURES.has(failure.code) && context
      ? ` (DATABASE_URL=${context.describe.database})`
      : failure.code === InfrastructureErrorCode.QUEUE_UNAVAILABLE && context
        ? ` (SQS: ${context.describe.sqs}${context.config.sqsEndpoint ? ', from AWS_ENDPOINT_URL_SQS' : ''})`
        : '';
  // The message may quote a run id or a reason from the database: one line, controls escaped.
  return oneLine(`ops ${commandName}: ${failure.message}${where} [${failure.code}]`);
}

function write(stream: NodeJS.WriteStream, text: string): Promise<void> {
  return new Promise((resolve) => stream.write(text.endsWith('\n') ? text : `${text}\n`, () => resolve()));
}

async function main(argv: readonly string[]): Promise<ExitCode> {
  routeDiagnosticsToStderr();
  let invocation: Invocation;
  try {
    invocation = parseInvocation(argv);
  } catch (error) {
    const failure = describeFailure(error);
    await write(process.stderr, failureLine(argv[commandIndex(argv)] ?? '', failure, undefined));
    if (argv.includes('--json')) await write(process.stdout, safeJson({ error: failure }));
    return failure.exitCode;
  }
  if (invocation.kind === 'help') {
    const text = invocation.command ? renderCommandHelp(invocation.command) : renderHelp(COMMANDS);
    await write(invocation.exitCode === ExitCode.OK ? process.stdout : process.stderr, text);
    return invocation.exitCode;
  }

  const { command, input, json, stage } = invocation;
  let context: OpsContext | undefined;
  try {
    context = createOpsContext(process.env, { stage });
    for (const line of context.stageOverrides) {
      await write(process.stderr, oneLine(`ops ${command.name}: ${line}`));
    }
    const output: CommandOutput = await command.run(input, context);
    // Database-sourced strings (run ids, reasons, actors) are in both: neither may reach the
    // terminal with a control character in it (see format.ts).
    await write(process.stdout, json ? safeJson(output.result) : printable(output.text));
    if (output.warning) await write(process.stderr, oneLine(`ops ${command.name}: ${output.warning}`));
    return output.exitCode ?? ExitCode.OK;
  } catch (error) {
    const failure = describeFailure(error);
    await write(process.stderr, failureLine(command.name, failure, context));
    if (json) await write(process.stdout, safeJson({ error: failure }));
    return failure.exitCode;
  } finally {
    await context?.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`ops: ${oneLine(describeFailure(error).message)}\n`);
    process.exit(ExitCode.INTERNAL);
  },
);
