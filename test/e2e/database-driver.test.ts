/**
 * The local entry points honour DATABASE_DRIVER (contract v1.2, section 4): `tcp` connects straight
 * to PostgreSQL and never starts or uses the WebSocket bridge, `neon` goes through the bridge (the
 * one DATABASE_WS_PROXY names, else one started for a loopback URL), and unset, a loopback URL
 * means `tcp`. A bridge address nothing listens on tells them apart: only the Neon driver needs it.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it, onTestFinished } from 'vitest';
import { startStack } from '../../infra/local/stack.ts';
import type { ChildRun } from '../support/child-process.ts';
import { type Command, runCommand } from '../support/commands.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { FAST_RETRY_ENV } from '../support/stack.ts';

const NOWHERE = '127.0.0.1:9';
const fixture = useDatabaseFixture();

function run(
  command: Command,
  args: readonly string[],
  env: Record<string, string | undefined>,
): Promise<ChildRun> {
  const childEnv: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: fixture.t.url,
    // Nothing the commands need beyond the database: ops fences reads only PostgreSQL.
    AWS_ENDPOINT_URL_SQS: 'http://127.0.0.1:9',
    DATABASE_CONNECT_TIMEOUT_MS: '3000',
    ...env,
  };
  for (const [key, value] of Object.entries(childEnv)) if (value === undefined) delete childEnv[key];
  return runCommand(command, args, { env: childEnv, timeoutMs: 60_000 });
}

const COMMANDS = [
  ['migrate', [] as string[]],
  ['ops', ['fences']],
] as const;

describe.each(COMMANDS)('npm run %s', (command, args) => {
  it('over tcp (DATABASE_DRIVER=tcp, or unset with a loopback URL) connects without any bridge', async () => {
    for (const driver of ['tcp', undefined]) {
      const result = await run(command, args, { DATABASE_DRIVER: driver, DATABASE_WS_PROXY: NOWHERE });
      expect(result.code, `${driver}: ${result.stderr}`).toBe(0);
    }
  });

  it('over neon goes through the bridge: the one DATABASE_WS_PROXY names, else its own', async () => {
    const named = await run(command, args, { DATABASE_DRIVER: 'neon', DATABASE_WS_PROXY: NOWHERE });
    expect(named.code).not.toBe(0);
    expect(named.stderr).toMatch(/database (connection failed|unavailable)|cannot connect/);
    const own = await run(command, args, { DATABASE_DRIVER: 'neon', DATABASE_WS_PROXY: undefined });
    expect(own.code, own.stderr).toBe(0);
  });

  it('refuses a DATABASE_DRIVER it does not know in one line naming it', async () => {
    const result = await run(command, args, { DATABASE_DRIVER: 'postgres' });
    expect(result.code).not.toBe(0);
    const lines = result.stderr.split('\n').filter((line) => line.trim() !== '');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`DATABASE_DRIVER="postgres" is invalid: must be 'neon' or 'tcp'`);
  });
});

describe('the local stack', () => {
  it.each([
    ['tcp', NOWHERE],
    ['neon', undefined],
  ])(
    'under DATABASE_DRIVER=%s (DATABASE_WS_PROXY %s) opens its pool with that driver and works',
    async (driver, wsProxy) => {
      const dataDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-driver-stack-'));
      onTestFinished(() => rm(dataDir, { recursive: true, force: true }));
      const stack = await startStack({
        env: {
          ...FAST_RETRY_ENV,
          DATABASE_DRIVER: driver,
          ...(wsProxy ? { DATABASE_WS_PROXY: wsProxy } : {}),
        },
        databaseUrl: fixture.t.url,
        sqsPort: 0,
        dataDir,
        logLevel: 'SILENT',
        sweeper: false,
        reclaimer: false,
      });
      onTestFinished(() => stack.stop());
      expect(stack.databaseDriver).toBe(driver);
      expect((await stack.db.query<{ one: number }>('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    },
  );
});
