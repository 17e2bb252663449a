import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type Database, openDatabase } from '../../functions/adapters/database.ts';
import { DATABASE_DRIVERS, type DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { DatabaseAuthenticationError, InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { runChild } from '../support/child-process.ts';
import { PROJECT_ROOT } from '../support/packaged-template.ts';
import { eventually } from '../support/stack.ts';

/**
 * A DATABASE_URL without a password against a server that asks for SCRAM (Neon, RDS, any
 * PostgreSQL with a scram-sha-256 hba line). The Neon driver's SASL code threw "client password
 * must be a string" from inside its socket's data handler, where nothing can catch it: the process
 * died; node-postgres fails the connect with "SASL: SCRAM-SERVER-FIRST-MESSAGE: client password
 * must be a string", naming neither the variable nor the fix. Both must be the clear
 * DATABASE_AUTH_FAILED a wrong password gets instead. Proven against a real PostgreSQL that checks
 * passwords with SCRAM (the embedded one: the machine's own PostgreSQL trusts every login) through
 * each real driver (Neon's through the local bridge).
 */
const ROLE = 'no_password_cleanup';

let postgres: EmbeddedPostgresHandle;
let postgresDir: string;
let wsProxy: string;
let admin: Database;
const opened: Database[] = [];

beforeAll(async () => {
  ({ wsProxy } = inject('database'));
  postgresDir = await mkdtemp(join(tmpdir(), 'rc-nopw-pg-'));
  postgres = await startEmbeddedPostgres({ dataDir: postgresDir, persistent: false });
  admin = await open(inject('database').driver, postgres.url);
  await admin.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD 'the-real-password'`);
});

afterAll(async () => {
  await Promise.allSettled(opened.map((db) => db.end()));
  await postgres?.stop();
  if (postgresDir) await rm(postgresDir, { recursive: true, force: true });
});

async function open(driver: DatabaseDriver, url: string): Promise<Database> {
  const db = await openDatabase({ url, driver, wsProxy, lockTimeoutMs: 5_000, statementTimeoutMs: 10_000 });
  opened.push(db);
  return db;
}

function urlWith(password: string | undefined): string {
  const url = new URL(postgres.url);
  url.username = ROLE;
  url.password = password ?? '';
  return url.toString();
}

describe.each(DATABASE_DRIVERS)(
  'over the %s driver: a DATABASE_URL without a password, against a SCRAM server',
  (driver) => {
    it('fails with DATABASE_AUTH_FAILED, and the process lives on', async () => {
      const db = await open(driver, urlWith(undefined));
      expect(new URL(urlWith(undefined)).password).toBe('');

      const error = await db.query('SELECT 1').catch((failure: unknown) => failure);

      expect(error).toBeInstanceOf(DatabaseAuthenticationError);
      // Retryable like every refused login (a deployed function reads its URL again first; a record
      // comes back with backoff while an operator fixes the secret, and dead-letters with this code).
      expect(error).toMatchObject({ code: InfrastructureErrorCode.DATABASE_AUTH_FAILED, retryable: true });
      expect((error as Error).message).toContain(`DATABASE_URL has none for user "${ROLE}"`);
      // Still alive and able to work: the same role with its password connects.
      const good = await open(driver, urlWith('the-real-password'));
      expect((await good.query<{ one: number }>('SELECT 1 AS one')).rows[0]?.one).toBe(1);
    });

    it('leaves no connection behind: the refused one is closed, not left "starting" on the server', async () => {
      // Neither pool ends a client whose connect failed; the server kept its backend waiting for the
      // password until authentication_timeout (60 s), one connection slot per refused attempt.
      const db = await open(driver, urlWith(undefined));
      await expect(db.query('SELECT 1')).rejects.toMatchObject({
        code: InfrastructureErrorCode.DATABASE_AUTH_FAILED,
      });
      await eventually(
        'the refused connection to close on the server',
        async () => {
          const { rows } = await admin.query<{ left: number }>(
            // Still authenticating: no user yet, and the state 'starting' (PostgreSQL 17 and later;
            // empty before). This cluster serves this file alone, and every other pool here is idle.
            `SELECT count(*)::int AS left FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND (state IS NULL OR state = 'starting')`,
          );
          return rows[0]!.left === 0;
        },
        10_000,
      );
    });

    it('fails a transaction the same way, without sending a byte of it', async () => {
      const db = await open(driver, urlWith(undefined));
      let ran = false;
      const error = await db
        .withTransaction(async (tx) => {
          ran = true;
          return tx.query('SELECT 1');
        })
        .catch((failure: unknown) => failure);
      expect(error).toMatchObject({ code: InfrastructureErrorCode.DATABASE_AUTH_FAILED });
      expect((error as Error).message).toContain('DATABASE_URL has none');
      expect(ran).toBe(false);
    });

    it('still connects without a password where the server trusts the login', async () => {
      const trusting = await open(
        driver,
        process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
      );
      expect(
        new URL(process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres').password,
      ).toBe('');
      expect((await trusting.query<{ one: number }>('SELECT 1 AS one')).rows[0]?.one).toBe(1);
    });

    it.each([
      ['npm run ops -- fences', ['run', '--silent', 'ops', '--', 'fences'], 3],
      ['npm run migrate', ['run', '--silent', 'migrate'], 1],
    ])(
      'ends `%s` with its failure exit and the reason, not a crash',
      async (_name, args, exitCode) => {
        const run = await runChild('npm', args, {
          cwd: PROJECT_ROOT,
          env: {
            ...process.env,
            DATABASE_URL: urlWith(undefined),
            DATABASE_DRIVER: driver,
            DATABASE_WS_PROXY: wsProxy,
          },
          timeoutMs: 60_000,
        });
        expect(run.code, run.stderr).toBe(exitCode);
        expect(run.stderr).toContain('DATABASE_URL has none');
        expect(run.stderr).not.toContain('SASL');
      },
      70_000,
    );
  },
);
