import { describe, expect, it } from 'vitest';
import { type Command, runCommand } from '../support/commands.ts';

/**
 * What the commands print when their connection string is wrong: the database named, its password
 * never. Each command runs as an operator runs it, a child process (test/support/commands.ts), with
 * a password that appears nowhere else, so any occurrence in the output is a leak.
 */
const SECRET = 'Zq9-s3cr3t';

const KEYWORD_DSN = `host=db.invalid port=5432 user=app password='${SECRET} pw' dbname=app`;
const URL_DSN_BAD_HOST = `postgres://app:${SECRET}@db.invalid:5432/app`;
const URL_DSN_UNPARSABLE = `postgres://app:${SECRET} p@w@db.invalid:99999/app`;

/** Every entry point that reads DATABASE_URL, with what it is started with. */
const COMMANDS = {
  migrate: ['migrate', []],
  ops: ['ops', ['fences']],
  stack: ['stack', []],
  'npm start': ['start', ['--runs', '1']],
} as const satisfies Record<string, readonly [Command, readonly string[]]>;

async function run(command: keyof typeof COMMANDS, databaseUrl: string) {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: databaseUrl,
    PGPASSWORD: SECRET,
    // Nothing may be reached by accident: no SQS endpoint, a provisioner that is not there.
    AWS_ENDPOINT_URL_SQS: 'http://127.0.0.1:9',
    SANDBOX_PROVISIONER_URL: 'http://127.0.0.1:9',
    DATABASE_CONNECT_TIMEOUT_MS: '3000',
  };
  delete env.DATABASE_WS_PROXY;
  const [name, args] = COMMANDS[command];
  return runCommand(name, args, { env, timeoutMs: 60_000 });
}

describe('a keyword-form DSN (host=… password=…)', () => {
  it.each(Object.keys(COMMANDS) as Array<keyof typeof COMMANDS>)(
    '%s refuses it naming DATABASE_URL, and prints no password',
    async (command) => {
      const result = await run(command, KEYWORD_DSN);
      const output = result.stdout + result.stderr;
      expect(result.code).not.toBe(0);
      expect(output).toContain('DATABASE_URL');
      // The value is shown redacted, quotes intact.
      expect(output).toContain('DATABASE_URL="host=db.invalid port=5432 user=app password=*** dbname=app"');
      expect(output).not.toContain(SECRET);
      expect(output).not.toContain(' pw');
    },
  );
});

describe('a URL-form DSN', () => {
  it('npm run migrate against a host that does not exist fails naming the database, not its password', async () => {
    const result = await run('migrate', URL_DSN_BAD_HOST);
    const output = result.stdout + result.stderr;
    expect(result.code).toBe(1);
    expect(output).toContain('migrate failed (postgres://app:***@db.invalid:5432/app)');
    // The driver's own words (a WebSocket ErrorEvent), not "[object Object]".
    expect(output).toMatch(/database connection failed: .*db\.invalid/);
    expect(output).not.toContain(SECRET);
  });

  it.each(['migrate', 'ops'] as const)(
    '%s refuses a URL that does not parse (a blank and an @ in the password), printing no password',
    async (command) => {
      const result = await run(command, URL_DSN_UNPARSABLE);
      const output = result.stdout + result.stderr;
      expect(result.code).not.toBe(0);
      expect(output).toContain('DATABASE_URL');
      expect(output).not.toContain(SECRET);
      expect(output).not.toContain('p@w');
    },
  );
});
