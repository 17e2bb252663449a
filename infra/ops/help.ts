/** The text of `ops help`, `ops --help` and `ops help <command>` / `ops <command> --help`. */
import type { Command } from './command.ts';
import { DEFAULT_DATABASE_URL } from './context.ts';
import { ExitCode } from './exit-codes.ts';

const INVOCATION = 'npm run ops --';

/** Code, short name, meaning. */
export const EXIT_CODE_HELP: ReadonlyArray<[number, string, string]> = [
  [ExitCode.OK, 'ok', 'ok'],
  [
    ExitCode.REFUSED,
    'refused',
    'refused or not found: unknown run, no pending fence, run or scope still active, reclaim --yes without settings of record',
  ],
  [ExitCode.USAGE, 'usage', 'bad usage or bad configuration: nothing was attempted'],
  [
    ExitCode.UNREACHABLE,
    'unreachable',
    'database or SQS unreachable (down, no such database, login refused), read-only (a replica), schema not migrated, queue missing, or (--stage) the database URL unreadable from SSM',
  ],
  [
    ExitCode.BUSY,
    'busy',
    "busy: a cleanup holds the scope's lock (or another session a table) longer than the lock timeout, or a delete may still be in flight; try again",
  ],
  [ExitCode.INTERNAL, 'bug', 'unexpected error (a bug: please report it with the output)'],
];

function synopsis(command: Command): string {
  const args = command.arguments.map((arg) => (arg.optional ? `[${arg.name}]` : `<${arg.name}>`));
  return [command.name, ...args].join(' ');
}

function optionLabel(name: string, spec: Command['options'][string]): string {
  const long = `--${name}${spec.type === 'string' ? ` <${spec.value ?? 'value'}>` : ''}`;
  return spec.short ? `-${spec.short}, ${long}` : long;
}

function columns(rows: ReadonlyArray<[string, string]>): string[] {
  const width = Math.max(...rows.map(([left]) => left.length)) + 2;
  return rows.map(([left, right]) => `  ${left.padEnd(width)}${right}`);
}

export function renderHelp(commands: readonly Command[]): string {
  return [
    `Operator CLI of the runtime cleanup.  ${INVOCATION} <command> [arguments] [options]`,
    '',
    'Commands',
    ...columns([
      ...commands.map((c): [string, string] => [synopsis(c), c.summary]),
      ['help [command]', "this help, or one command's"],
    ]),
    '',
    'Options of every command',
    ...columns([
      ['--json', 'print one JSON document (stable shape) instead of tables; errors as {"error": {...}}'],
      [
        '--stage <name>',
        'a deployed stage: its queues (<name>-*) and its database URL from SSM /runtime-cleanup/<name>/database-url; the variables below win',
      ],
      ['-h, --help', 'help'],
    ]),
    '',
    'Exit codes',
    ...columns(EXIT_CODE_HELP.map(([code, , meaning]): [string, string] => [String(code), meaning])),
    '',
    'Configuration (environment; the same as the functions)',
    ...columns([
      [
        'DATABASE_URL',
        `default ${DEFAULT_DATABASE_URL}; deployed, use --stage (or export it from its SSM parameter)`,
      ],
      ['DATABASE_DRIVER', 'neon or tcp; unset: neon for Neon hosts (*.neon.tech), tcp otherwise'],
      [
        'DATABASE_WS_PROXY',
        'host:port of a local WebSocket bridge for the neon driver (for a loopback DATABASE_URL one is started)',
      ],
      ['AWS_ENDPOINT_URL_SQS', 'unset: AWS through the SDK defaults (AWS_REGION, credential chain)'],
      ['QUEUE_NAME_PREFIX', 'stage prefix of the deployed queue names'],
      [
        'SANDBOX_PROVISIONER_URL',
        'the provisioner orphans and reclaim list and delete at (required by them)',
      ],
      ['…', 'the timeouts and retry settings: see check-config'],
    ]),
    '',
    'Output (tables or JSON) goes to stdout; logs and metrics to stderr. Passwords are never printed.',
  ].join('\n');
}

export function renderCommandHelp(command: Command): string {
  const options: Array<[string, string]> = [
    ...Object.entries(command.options).map(([name, spec]): [string, string] => [
      optionLabel(name, spec),
      spec.description,
    ]),
    ['--json', 'print one JSON document instead of tables'],
    ['--stage <name>', "a deployed stage's queues and database (npm run ops -- help)"],
  ];
  return [
    `${INVOCATION} ${synopsis(command)} [options]`,
    '',
    `  ${command.summary}`,
    ...(command.details ? ['', ...command.details.split('\n').map((line) => `  ${line}`)] : []),
    '',
    'Options',
    ...columns(options),
    '',
    `Exit codes: ${EXIT_CODE_HELP.map(([code, name]) => `${code} ${name}`).join(', ')} (npm run ops -- help).`,
  ].join('\n');
}
