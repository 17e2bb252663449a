import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { builtSqlIn, REVIEWED_EXCEPTIONS, scanFunctionsForBuiltSql } from './sql-scan.ts';

/**
 * "Never a query built from text": a static scan of functions/**\/*.ts for SQL assembled with a
 * template substitution or string concatenation, with one reviewed exception. The scanner itself
 * is shown to find what it looks for, so a clean result means something.
 */
describe('SQL under functions/ is parameterised', () => {
  it('builds no SQL from template substitutions or concatenation, except the reviewed BEGIN statement', async () => {
    const scan = await scanFunctionsForBuiltSql();
    expect(scan.files).toBeGreaterThan(20);
    expect(scan.findings).toEqual([]);
    // The exception is still where it was reviewed; if it moved or changed, review it again.
    expect(scan.reviewedExceptionsPresent).toBe(REVIEWED_EXCEPTIONS.length);
  });

  it('the scanner finds built SQL in its many disguises, and leaves parameterised SQL and messages alone', () => {
    // `§{` stands for a template substitution here (written out, it would be one in this file).
    const source = [
      'const a = `SELECT * FROM agent_runs WHERE id = §{runId}`;',
      "const b = 'DELETE FROM sandbox_runtimes WHERE uid = ' + uid;",
      "const c = `UPDATE agent_runs SET status = 'x' WHERE id = §{id}`;",
      'const d = `WITH x AS (SELECT 1) SELECT §{column} FROM x`;',
      'const ok1 = `SELECT * FROM agent_runs WHERE id = $1::text`;',
      "const ok2 = 'SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))';",
      'const ok3 = `release lock for scope §{key} not acquired within §{ms} ms`;',
      '// const commented = `SELECT * FROM t WHERE id = §{x}`;',
    ]
      .join('\n')
      .replaceAll('§{', '${');
    const findings = builtSqlIn('functions/example.ts', source);
    expect(findings.map((finding) => finding.line)).toEqual([1, 2, 3, 4]);
  });
});

/**
 * "Provisioner responses read with a size limit": a server whose answer never ends. A client that
 * read bodies without a limit would wait for its delete timeout (30 s here) and fail with it; the
 * client must instead give up on the body by itself.
 */
describe('provisioner answers are read with a size limit', () => {
  let server: Server;
  let client: ProvisionerClient;
  beforeAll(async () => {
    server = createServer((request, response) => {
      const conflict = request.url?.includes('endless-409');
      response.writeHead(conflict ? 409 : 200, { 'content-type': 'application/json' });
      response.write('{"current_generation": 9, "padding": "');
      const chunk = 'x'.repeat(64 * 1024);
      const pump = () => {
        while (!response.destroyed && response.write(chunk)) {}
        if (!response.destroyed) response.once('drain', pump);
      };
      pump();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    client = new ProvisionerClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  });
  afterAll(async () => {
    await client.close();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  it('gives up on an endless 409 body as a bad response, not by timing out', async () => {
    await expect(
      client.deleteSandbox({ sandboxId: 'endless-409', generation: 1, deleteTimeoutMs: 30_000 }),
    ).rejects.toMatchObject({ code: 'PROVISIONER_BAD_RESPONSE' });
  });

  it('refuses an endless 200 as unconfirmed after reading at most the limit of its body', async () => {
    await expect(
      client.deleteSandbox({ sandboxId: 'endless-200', generation: 1, deleteTimeoutMs: 30_000 }),
    ).rejects.toMatchObject({ code: 'PROVISIONER_UNCONFIRMED' });
  });
});
