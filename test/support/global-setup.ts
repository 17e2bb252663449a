import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { openDatabase } from '../../functions/adapters/database.ts';
import { startDatabaseBridge } from '../../infra/local/db-bridge.ts';
import { type EmbeddedPostgresHandle, startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { migrate } from '../../infra/migrate.ts';
import { type PgBouncer, poolerRequested, startPoolerFor } from './pgbouncer.ts';

/**
 * Once per `vitest run`: a PostgreSQL (DATABASE_URL, else embedded-postgres), the WebSocket bridge
 * the Neon driver goes through, and a migrated template database that every test file clones
 * (`CREATE DATABASE … TEMPLATE`, about 30 ms) so each file starts from a fresh schema.
 */
declare module 'vitest' {
  export interface ProvidedContext {
    /** `poolerPort`: set under DATABASE_POOLER=pgbouncer; test databases are then reached through it. */
    database: { adminUrl: string; template: string; wsProxy: string; poolerPort: number | null };
  }
}

export default async function setup(project: TestProject) {
  let embedded: EmbeddedPostgresHandle | undefined;
  let embeddedDir: string | undefined;
  let adminUrl = process.env.DATABASE_URL;
  if (!adminUrl) {
    embeddedDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-test-pg-'));
    embedded = await startEmbeddedPostgres({ dataDir: embeddedDir, persistent: false });
    adminUrl = embedded.url;
  }
  const bridge = await startDatabaseBridge();
  let pooler: PgBouncer | undefined;
  const template = `rc_template_${process.pid}`;
  const admin = await openDatabase({
    url: adminUrl,
    wsProxy: bridge.address,
    lockTimeoutMs: 10_000,
    statementTimeoutMs: 60_000,
  });
  const teardown = async () => {
    // Test files drop their own databases; this sweeps up after any that crashed.
    const leftovers = await admin.query<{ datname: string }>(
      `SELECT datname FROM pg_database WHERE datname LIKE $1::text OR datname = $2::text`,
      [`rc_test_${process.pid}_%`, template],
    );
    for (const { datname } of leftovers.rows) {
      await admin.query(`DROP DATABASE IF EXISTS "${datname.replace(/"/g, '')}" WITH (FORCE)`);
    }
    await admin.end();
    await pooler?.stop();
    await bridge.close();
    if (embedded) await embedded.stop();
    if (embeddedDir) await rm(embeddedDir, { recursive: true, force: true });
  };
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${template}`);
    await admin.query(`CREATE DATABASE ${template}`);
    const templateUrl = new URL(adminUrl);
    templateUrl.pathname = `/${template}`;
    const templateDb = await openDatabase({
      url: templateUrl.toString(),
      wsProxy: bridge.address,
      maxConnections: 1,
      lockTimeoutMs: 10_000,
      statementTimeoutMs: 60_000,
    });
    await migrate(templateDb);
    await templateDb.end();
    // The template is migrated directly: a pooler would keep server connections to it open, and
    // PostgreSQL refuses to copy a template database somebody is connected to.
    if (poolerRequested()) pooler = await startPoolerFor(adminUrl);
  } catch (error) {
    await teardown().catch(() => {});
    throw error;
  }

  project.provide('database', {
    adminUrl,
    template,
    wsProxy: bridge.address,
    poolerPort: pooler?.port ?? null,
  });
  return teardown;
}
