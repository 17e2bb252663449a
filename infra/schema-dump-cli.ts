/**
 * `npm run schema:dump`: migrates a new, empty database on DATABASE_URL's server, writes its schema
 * (infra/schema-dump.ts) to infra/schema.sql, drops the database and exits.
 */
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { loadConfig, refuseParameterWithoutUrl } from '../functions/adapters/config.ts';
import { describeDatabase } from '../functions/adapters/database.ts';
import { redactSecrets } from '../functions/adapters/redact.ts';
import { acceptNoOptionCommandLine } from './command-line.ts';
import { closeLocalBridge, openLocalDatabase } from './local/database.ts';
import { migrate } from './migrate.ts';
import { dumpSchema, SCHEMA_FILE } from './schema-dump.ts';

const USAGE = `Usage: npm run schema:dump [-- --help]

Creates an empty database on the server DATABASE_URL names (default:
postgres://postgres@127.0.0.1:5432/postgres; the role must be allowed to CREATE DATABASE), applies
infra/sql and infra/migrations to it, writes its schema to infra/schema.sql, and drops it.
Takes no options. test/integration/schema-dump.test.ts fails when infra/schema.sql is out of date.

Variables: DATABASE_URL, DATABASE_WS_PROXY, DATABASE_CONNECT_TIMEOUT_MS.
Exit status: 0 written, 1 failed, 2 usage error.`;

async function main(): Promise<void> {
  if (!acceptNoOptionCommandLine('npm run schema:dump', USAGE, process.argv.slice(2))) return;
  const config = loadConfig();
  refuseParameterWithoutUrl(config);
  const url = config.databaseUrl ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const open = (target: string) =>
    openLocalDatabase({
      url: target,
      ...(config.databaseWsProxy ? { wsProxy: config.databaseWsProxy } : {}),
      maxConnections: 1,
      lockTimeoutMs: config.databaseLockTimeoutMs,
      statementTimeoutMs: Math.max(config.databaseStatementTimeoutMs, 300_000),
      connectTimeoutMs: config.databaseConnectTimeoutMs,
    });
  const admin = await open(url);
  // CREATE DATABASE takes no parameters: the name is made here from hex digits only.
  const name = `rc_schema_dump_${randomBytes(5).toString('hex')}`;
  try {
    await admin.query(`CREATE DATABASE ${name}`);
    const target = new URL(url);
    target.pathname = `/${name}`;
    const db = await open(target.toString());
    try {
      await migrate(db);
      await writeFile(SCHEMA_FILE, await dumpSchema(db));
    } finally {
      await db.end();
    }
    console.log(
      JSON.stringify({
        level: 'INFO',
        message: 'schema written',
        file: 'infra/schema.sql',
        database: describeDatabase(url),
      }),
    );
  } finally {
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
    await admin.end();
    await closeLocalBridge();
  }
}

main().catch((error: unknown) => {
  const target = process.env.DATABASE_URL
    ? describeDatabase(process.env.DATABASE_URL)
    : 'the default database';
  console.error(
    `schema:dump failed (${target}): ${error instanceof Error ? redactSecrets(error.message) : String(error)}`,
  );
  process.exit(1);
});
