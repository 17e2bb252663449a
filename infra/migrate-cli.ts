/** `npm run migrate`: applies the migrations to DATABASE_URL (idempotent) and exits. */
import { loadConfig, refuseParameterWithoutUrl } from '../functions/adapters/config.ts';
import { describeDatabase } from '../functions/adapters/database.ts';
import { redactSecrets } from '../functions/adapters/redact.ts';
import { acceptNoOptionCommandLine } from './command-line.ts';
import { closeLocalBridge, openLocalDatabase } from './local/database.ts';
import { applySchema } from './migrate.ts';

const USAGE = `Usage: npm run migrate [-- --help]

Applies the SQL functions in infra/sql (each file new or changed since it was last applied) and
then the pending migrations in infra/migrations to the database DATABASE_URL names (default:
postgres://postgres@127.0.0.1:5432/postgres), in one transaction under an advisory lock, and exits.
Idempotent: what is already applied is skipped. Takes no options.

Variables: DATABASE_URL, DATABASE_DRIVER, DATABASE_WS_PROXY, DATABASE_CONNECT_TIMEOUT_MS,
DATABASE_LOCK_TIMEOUT_MS, DATABASE_STATEMENT_TIMEOUT_MS (DATABASE_URL_PARAMETER is not read here:
export DATABASE_URL from the parameter first).
Exit status: 0 applied or up to date, 1 failed, 2 usage error.`;

async function main(): Promise<void> {
  if (!acceptNoOptionCommandLine('npm run migrate', USAGE, process.argv.slice(2))) return;
  const config = loadConfig();
  refuseParameterWithoutUrl(config);
  const url = config.databaseUrl ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const db = await openLocalDatabase({
    url,
    driver: config.databaseDriver,
    wsProxy: config.databaseWsProxy,
    maxConnections: 1,
    lockTimeoutMs: config.databaseLockTimeoutMs,
    // Migrations may rewrite tables: give them longer than a cleanup transaction gets.
    statementTimeoutMs: Math.max(config.databaseStatementTimeoutMs, 300_000),
    // The query timeout then defaults to that statement timeout plus a margin.
    connectTimeoutMs: config.databaseConnectTimeoutMs,
  });
  try {
    const changes = await applySchema(db);
    console.log(
      JSON.stringify({
        level: 'INFO',
        message:
          changes.migrations.length || changes.functions.length ? 'migrations applied' : 'schema up to date',
        applied: changes.migrations,
        functions: changes.functions,
        database: describeDatabase(url),
      }),
    );
  } finally {
    await db.end();
    await closeLocalBridge();
  }
}

main().catch((error: unknown) => {
  const target = process.env.DATABASE_URL
    ? describeDatabase(process.env.DATABASE_URL)
    : 'the default database';
  console.error(
    `migrate failed (${target}): ${error instanceof Error ? redactSecrets(error.message) : String(error)}`,
  );
  process.exit(1);
});
