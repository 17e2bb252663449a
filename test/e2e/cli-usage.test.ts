/**
 * `npm run migrate` and `npm run stack` take no options: `--help` prints the usage and exits 0
 * without touching anything, and anything else is a usage error (exit 2) — never "go ahead".
 * Every case points the command at things that do not answer, so a command that went ahead
 * anyway would fail with exit 1 instead.
 */
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import { runChild } from '../support/child-process.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const ENTRY = { migrate: 'infra/migrate-cli.ts', stack: 'infra/local/stack-cli.ts' } as const;

let nowhere: Record<string, string>;
beforeAll(async () => {
  nowhere = {
    DATABASE_URL: `postgres://postgres@127.0.0.1:${await freePort()}/postgres`,
    AWS_ENDPOINT_URL_SQS: `http://127.0.0.1:${await freePort()}`,
    SANDBOX_PROVISIONER_URL: 'http://127.0.0.1:9',
  };
});

function run(command: keyof typeof ENTRY, args: string[]) {
  const env: NodeJS.ProcessEnv = { ...process.env, ...nowhere };
  delete env.DATABASE_WS_PROXY;
  return runChild(process.execPath, ['--import', 'tsx', join(ROOT, ENTRY[command]), ...args], {
    cwd: ROOT,
    env,
    timeoutMs: 60_000,
  });
}

describe.each(Object.keys(ENTRY) as Array<keyof typeof ENTRY>)('npm run %s', (command) => {
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
