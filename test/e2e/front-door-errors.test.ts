/**
 * What a person meets first, through the real command-line processes: a variable that points
 * nowhere, a host that does not resolve, a database that does not exist, a request for help.
 * Each answer is one line that names the problem and the way out, with the documented exit code,
 * and never a stack trace or "[object Object]".
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import type { ChildRun } from '../support/child-process.ts';
import { type Command, runCommand } from '../support/commands.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

const CHILD_TIMEOUT_MS = 60_000;
const UNRESOLVABLE_DATABASE = 'postgres://postgres@nosuchhost.invalid/x';

let t: TestDatabase;
let scratch: string;
beforeAll(async () => {
  t = await createTestDatabase();
  scratch = await mkdtemp(join(tmpdir(), 'rc-front-door-'));
});
afterAll(async () => {
  await t?.drop();
  await rm(scratch, { recursive: true, force: true });
});

/** `npm run <command> -- args` minus npm's start-up (commands.ts). */
function run(command: Command, args: string[], env: Record<string, string | undefined>) {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, ...env };
  for (const [key, value] of Object.entries(childEnv)) if (value === undefined) delete childEnv[key];
  return runCommand(command, args, { env: childEnv, timeoutMs: CHILD_TIMEOUT_MS });
}

const lines = (text: string) => text.split('\n').filter((line) => line.trim() !== '');

function expectOneClearLine(output: string): string {
  const printed = lines(output);
  expect(printed, output).toHaveLength(1);
  expect(output).not.toContain('[object Object]');
  expect(output).not.toMatch(/\n\s+at /);
  return printed[0]!;
}

/** What a stack with everything else given needs: no embedded PostgreSQL, no built-in provisioner. */
function stackEnv(extra: Record<string, string | undefined>) {
  return {
    DATABASE_URL: t.url,
    DATABASE_WS_PROXY: undefined,
    SANDBOX_PROVISIONER_URL: 'http://127.0.0.1:9',
    AWS_ENDPOINT_URL_SQS: undefined,
    ...extra,
  };
}

describe('npm run stack with AWS_ENDPOINT_URL_SQS pointing where nothing listens', () => {
  it('names the variable and its value, and the two ways out, in one line with exit status 1', async () => {
    const endpoint = `http://127.0.0.1:${await freePort()}`;
    const result = await run('stack', [], stackEnv({ AWS_ENDPOINT_URL_SQS: endpoint }));
    expect(result.code, result.stderr).toBe(1);
    const line = expectOneClearLine(result.stderr);
    expect(line).toContain(`AWS_ENDPOINT_URL_SQS=${endpoint} does not answer (connect ECONNREFUSED`);
    expect(line).toContain('start that SQS endpoint');
    expect(line).toContain('or unset AWS_ENDPOINT_URL_SQS and the stack starts its own emulator');
  });
});

describe('a DATABASE_URL whose host does not resolve', () => {
  const resolverError = /getaddrinfo (ENOTFOUND|EAI_AGAIN) nosuchhost\.invalid/;

  const cases: Array<[string, () => Promise<ChildRun>, number]> = [
    ['npm run ops', () => run('ops', ['fences'], { DATABASE_URL: UNRESOLVABLE_DATABASE }), 3],
    ['npm run migrate', () => run('migrate', [], { DATABASE_URL: UNRESOLVABLE_DATABASE }), 1],
    ['npm run stack', () => run('stack', [], stackEnv({ DATABASE_URL: UNRESOLVABLE_DATABASE })), 1],
  ];
  it.each(cases)('%s says which host, not "[object Object]"', async (_name, start, code) => {
    const result = await start();
    expect(result.code, result.stderr).toBe(code);
    expect(expectOneClearLine(result.stderr)).toMatch(resolverError);
  });

  it('npm start says which host, and that DATABASE_URL names it', async () => {
    const result = await run('start', ['--runs', '1', '--quiet', '--data-dir', scratch, '--out', scratch], {
      DATABASE_URL: UNRESOLVABLE_DATABASE,
    });
    expect(result.code, result.stdout + result.stderr).toBe(1);
    const output = result.stdout + result.stderr;
    expect(output).not.toContain('[object Object]');
    expect(output).toMatch(resolverError);
    expect(output).toContain('DATABASE_URL=postgres://postgres@nosuchhost.invalid/x cannot be reached');
  });
});

describe('npm run ops against a server that answers but refuses', () => {
  /** `ops fences` against the test cluster, through the test bridge, with its URL changed by `alter`. */
  async function opsAgainst(alter: (url: URL) => void): Promise<string> {
    const url = new URL(inject('database').adminUrl);
    alter(url);
    const result = await run('ops', ['fences'], {
      DATABASE_URL: url.toString(),
      DATABASE_WS_PROXY: t.wsProxy,
    });
    // 3, not 5: a wrong DATABASE_URL is the operator's to fix, not a bug to report.
    expect(result.code, result.stderr).toBe(3);
    return expectOneClearLine(result.stderr);
  }

  it('a database that does not exist: exit status 3 and DATABASE_NOT_FOUND', async () => {
    const line = await opsAgainst((url) => {
      url.pathname = `/rc_missing_${randomBytes(4).toString('hex')}`;
    });
    expect(line).toContain('the server has no such database');
    expect(line).toContain('[DATABASE_NOT_FOUND]');
  });

  it('a login the server refuses: exit status 3, the password not printed', async () => {
    const line = await opsAgainst((url) => {
      url.username = `rc_no_such_role_${randomBytes(3).toString('hex')}`;
      url.password = 'not-the-password';
    });
    expect(line).toContain('the server refused the login');
    expect(line).not.toContain('not-the-password');
  });
});

describe('npm run chaos on its command line', () => {
  it('--help prints the usage and exits 0', async () => {
    const result = await run('chaos', ['--help'], {});
    expect(result.code, result.stderr).toBe(0);
    expect(result.stdout).toContain('npm run chaos -- [options]');
    expect(result.stdout).toContain('--seed N');
    expect(result.stderr).toBe('');
  });

  it('an unknown option or a bad value: one line and exit status 2, nothing run', async () => {
    const unknown = await run('chaos', ['--bogus'], {});
    expect(unknown.code).toBe(2);
    expect(expectOneClearLine(unknown.stderr)).toBe(
      "npm run chaos: Unknown option '--bogus'; see: npm run chaos -- --help",
    );
    const zero = await run('chaos', ['--runs', '0'], {});
    expect(zero.code).toBe(2);
    expect(expectOneClearLine(zero.stderr)).toBe(
      'npm run chaos: --runs "0" is invalid: must be a positive integer',
    );
  });
});
