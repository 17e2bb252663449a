/**
 * `npm run ops` against databases that answer, but not the way a command needs: a read-only one
 * (a replica's endpoint, or default_transaction_read_only on), a table locked by another session,
 * a URL that is not PostgreSQL's, and loopback spelled the many ways people spell it. Each answer
 * is one line that names the variable to fix and ends with the documented exit code — not exit 5
 * ("a bug") and not "unreachable" for a database that is merely busy.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ChildRun } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fenceOf, finishedRootRun } from '../support/factories.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { type SqsEmulator, startSqsEmulator } from '../support/sqs-emulator.ts';

let t: TestDatabase;
let sqs: SqsEmulator;
beforeAll(async () => {
  t = await createTestDatabase();
  sqs = await startSqsEmulator();
});
afterAll(async () => {
  await t?.drop();
  await sqs?.stop();
});

function ops(args: string[], env: Record<string, string | undefined> = {}): Promise<ChildRun> {
  const childEnv: NodeJS.ProcessEnv = {
    DATABASE_URL: t.url,
    DATABASE_WS_PROXY: t.wsProxy,
    AWS_ENDPOINT_URL_SQS: sqs.endpoint,
    QUEUE_NAME_PREFIX: '',
    ...env,
  };
  return runOpsCli(args, {
    env: childEnv,
    timeoutMs: 30_000,
  });
}

function oneLine(run: ChildRun): string {
  const lines = run.stderr.split('\n').filter((line) => line.trim() !== '' && !line.startsWith('{'));
  expect(lines, run.stderr).toHaveLength(1);
  return lines[0]!;
}

// A database default (ALTER DATABASE … SET) reaches only connections opened after it; behind a
// transaction pooler the ops command is served by a server connection PgBouncer opened earlier, so
// the setting this test relies on never applies there. The direct run covers the behaviour.
describe.skipIf(process.env.DATABASE_POOLER === 'pgbouncer')('a read-only database', () => {
  it('force-clear says the database is read-only and names DATABASE_URL, exit 3, and changes nothing', async () => {
    const scenario = await finishedRootRun(t.db);
    await t.db.query(`ALTER DATABASE ${t.name} SET default_transaction_read_only = on`);
    try {
      const run = await ops(['force-clear', scenario.rootRunId, '--reason', 'replica test', '--yes']);
      expect(run.code, run.stderr).toBe(3);
      const line = oneLine(run);
      expect(line).toContain('the database is read-only');
      expect(line).toContain('point DATABASE_URL at the primary');
      expect(line).toContain('[DATABASE_READ_ONLY]');
    } finally {
      await t.db.query(`ALTER DATABASE ${t.name} RESET default_transaction_read_only`);
    }
    expect(await fenceOf(t.db, scenario.rootRunId)).toBe(true);
  });

  it('reads still work on it', async () => {
    await t.db.query(`ALTER DATABASE ${t.name} SET default_transaction_read_only = on`);
    try {
      const run = await ops(['fences']);
      expect(run.code, run.stderr).toBe(0);
    } finally {
      await t.db.query(`ALTER DATABASE ${t.name} RESET default_transaction_read_only`);
    }
  });
});

describe('a table locked by another session', () => {
  it('is reported as locked within DATABASE_LOCK_TIMEOUT_MS, exit 4, not as an unreachable database', async () => {
    const holder = await t.connect({ maxConnections: 1 });
    try {
      const run = await holder.withTransaction(async (tx) => {
        await tx.query('LOCK TABLE agent_runs IN ACCESS EXCLUSIVE MODE');
        return ops(['fences'], { DATABASE_LOCK_TIMEOUT_MS: '500' });
      });
      expect(run.code, run.stderr).toBe(4);
      const line = oneLine(run);
      expect(line).toContain('locked by another session');
      expect(line).toContain('lock timeout');
      expect(line).toContain('DATABASE_LOCK_TIMEOUT_MS (500 ms)');
      expect(line).toContain('[DATABASE_LOCKED]');
      expect(line).not.toMatch(/cannot connect|unreachable|DATABASE_UNAVAILABLE/);
    } finally {
      await holder.end();
    }
  });
});

describe('a DATABASE_URL that is not PostgreSQL', () => {
  it.each(['mysql://root:hunter2@127.0.0.1:3306/app', 'http://127.0.0.1:5432/app'])(
    '%s is refused before anything connects, naming the variable, exit 2',
    async (url) => {
      const run = await ops(['fences'], { DATABASE_URL: url });
      expect(run.code, run.stderr).toBe(2);
      const line = oneLine(run);
      expect(line).toMatch(/^DATABASE_URL=/);
      expect(line).toContain('must be a postgres:// or postgresql:// URL');
      expect(line).not.toContain('hunter2');
    },
  );
});

describe('loopback, however it is spelled', () => {
  it.each(['LOCALHOST', 'localhost', '127.1', '127.0.0.1'])(
    'DATABASE_URL with host %s works (under the neon driver: through the in-process bridge)',
    async (host) => {
      const url = new URL(t.url);
      if (!['127.0.0.1', 'localhost'].includes(url.hostname)) return; // a pooler run: the host is not ours to respell
      const respelled = t.url.replace(`@${url.host}`, `@${host}:${url.port}`);
      const run = await ops(['fences'], { DATABASE_URL: respelled, DATABASE_WS_PROXY: undefined });
      expect(run.code, run.stderr).toBe(0);
      expect(run.stdout).toMatch(/pending fence|No pending fences/);
    },
  );
});
