/**
 * "Provisioner responses read with a size limit": a server whose answer never ends. A client that
 * read bodies without a limit would wait for its delete timeout (30 s here) and fail with it; the
 * client must instead give up on the body by itself.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';

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
