/**
 * `npm run migrate` and `npm run stack` take no options: `--help` prints the usage and exits 0
 * without touching anything, and anything else is a usage error (exit 2) — never "go ahead".
 * Every case points the command at things that do not answer, so a command that went ahead
 * anyway would fail with exit 1 instead.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import { type Command, runCommand } from '../support/commands.ts';

const COMMANDS = ['migrate', 'stack'] as const satisfies readonly Command[];

let nowhere: Record<string, string>;
beforeAll(async () => {
  nowhere = {
    DATABASE_URL: `postgres://postgres@127.0.0.1:${await freePort()}/postgres`,
    AWS_ENDPOINT_URL_SQS: `http://127.0.0.1:${await freePort()}`,
    SANDBOX_PROVISIONER_URL: 'http://127.0.0.1:9',
  };
});

function run(command: Command, args: string[]) {
  const env: NodeJS.ProcessEnv = { ...process.env, ...nowhere };
  delete env.DATABASE_WS_PROXY;
  return runCommand(command, args, { env, timeoutMs: 60_000 });
}

describe.each(COMMANDS)('npm run %s', (command) => {
  it.each([['--help'], ['-h']])(
    '%s prints the usage on stdout and exits 0 without doing the work',
    async (flag) => {
      const result = await run(command, [flag]);
      expect(result.code, result.stderr).toBe(0);
      expect(result.stdout).toMatch(new RegExp(`^Usage: npm run ${command}`));
      expect(result.stderr).toBe('');
    },
  );

  it.each([['--bogus'], ['--json'], ['extra']])(
    '%s is a usage error: the usage on stderr, exit 2',
    async (arg) => {
      const result = await run(command, [arg]);
      expect(result.code, result.stderr).toBe(2);
      expect(result.stdout).toBe('');
      expect(result.stderr).toContain(`npm run ${command}: `);
      expect(result.stderr).toContain(`Usage: npm run ${command}`);
    },
  );
});
