import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { codeBlocks, codeIn, documentedColumns, readDoc, section, tableRows } from '../support/docs.ts';

/**
 * Section 1 of docs/integration.md against the database the migrations build: every table and
 * column it names exists with the type it gives, every column of those tables is named there,
 * and every SQL function it lists exists with its argument and result types.
 */
const POSTGRES_TYPE: Record<string, string> = {
  bigint: 'bigint',
  integer: 'integer',
  text: 'text',
  boolean: 'boolean',
  timestamptz: 'timestamp with time zone',
  'double precision': 'double precision',
};

const COLUMNS = `
  SELECT table_name, column_name, data_type FROM information_schema.columns
  WHERE table_schema = 'public' ORDER BY table_name, ordinal_position`;
const FUNCTION = `
  SELECT pg_get_function_identity_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname = 'public' AND p.proname = $1::text`;

let t: TestDatabase;
let schemaSection: string;
beforeAll(async () => {
  t = await createTestDatabase();
  schemaSection = section(await readDoc('docs/integration.md'), 1);
});
afterAll(async () => {
  await t?.drop();
});

describe('docs/integration.md, section 1, against the migrated schema', () => {
  it('names exactly the tables and columns the migrations create, with their types', async () => {
    const documented = documentedColumns(codeBlocks(schemaSection, 'sql'));
    expect(documented.length).toBeGreaterThan(20);
    const { rows } = await t.db.query<{ table_name: string; column_name: string; data_type: string }>(
      COLUMNS,
    );
    const actual = rows.map((row) => `${row.table_name}.${row.column_name}: ${row.data_type}`).sort();
    const claimed = documented
      .map((column) => `${column.table}.${column.column}: ${POSTGRES_TYPE[column.type]}`)
      .sort();
    expect(claimed).toEqual(actual);
  });

  it('lists the SQL functions with the arguments and result they have', async () => {
    const listed = tableRows(schemaSection).filter((row) => codeIn(row[0] ?? '')?.includes('('));
    expect(listed.length).toBe(2);
    for (const [signature, result] of listed) {
      const [, name, args] = /^(\w+)\((.*)\)$/.exec(codeIn(signature!)!)!;
      const { rows } = await t.db.query<{ arguments: string; result: string }>(FUNCTION, [name]);
      expect(rows, `${name} exists once`).toHaveLength(1);
      expect(rows[0]!.arguments).toBe(args);
      expect(rows[0]!.result).toBe(codeIn(result!));
    }
  });
});
