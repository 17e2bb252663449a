/**
 * infra/schema.sql is the schema a migrated database has (`npm run schema:dump` rewrites it), and
 * every SQL function in that database has its one file under infra/sql/. Runs against the embedded
 * PostgreSQL 18 and the machine's PostgreSQL alike: the dump is read from the catalog
 * (infra/schema-dump.ts), not by a pg_dump of whatever version is installed.
 */
import { readFile } from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadFunctionFiles } from '../../infra/migrate.ts';
import { dumpSchema, SCHEMA_FILE } from '../../infra/schema-dump.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase();
});
afterAll(async () => {
  await t?.drop();
});

describe('the committed schema dump', () => {
  it('is what a freshly migrated database has (else: npm run schema:dump)', async () => {
    const committed = await readFile(SCHEMA_FILE, 'utf8');
    expect(await dumpSchema(t.db), 'infra/schema.sql is out of date: run npm run schema:dump').toBe(
      committed,
    );
  });

  it('sees a change to any kind of object it lists (negative control)', async () => {
    const before = await dumpSchema(t.db);
    const changes = [
      'ALTER TABLE agent_runs ADD COLUMN extra text',
      'CREATE INDEX agent_runs_extra ON agent_runs (finished_at)',
      'ALTER TABLE runtime_cleanup_overrides ADD CONSTRAINT extra_check CHECK (id > 0)',
      'CREATE FUNCTION schema_dump_extra() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$',
      'CREATE TRIGGER extra BEFORE DELETE ON agent_runs FOR EACH ROW EXECUTE FUNCTION agent_runs_track_fence()',
    ];
    for (const change of changes) {
      const after = await t.db
        .withTransaction(async (tx) => {
          await tx.query(change);
          const dump = await dumpSchema(tx);
          throw Object.assign(new Error('rolled back'), { dump });
        })
        .catch((error: { dump?: string }) => error.dump);
      expect(after, change).toBeDefined();
      expect(after, change).not.toBe(before);
    }
    expect(await dumpSchema(t.db)).toBe(before);
  });

  it('holds each function once, and each has its file under infra/sql/, and each file its function', async () => {
    const { rows } = await t.db.query<{ name: string }>(
      `SELECT p.proname AS name FROM pg_proc p
       WHERE p.pronamespace = current_schema()::regnamespace ORDER BY p.proname COLLATE "C"`,
    );
    const files = (await loadFunctionFiles()).map((file) => file.name).sort();
    expect(rows.map((row) => row.name)).toEqual(files);
  });
});
