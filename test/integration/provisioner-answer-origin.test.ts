/**
 * Whose answer is it? A 404 or a 200 counts for the delete only when it is the provisioner's
 * (contract v1.1, section 3). A wrong SANDBOX_PROVISIONER_URL, a missing route or an ingress in
 * front of no backend answers a 404 PAGE, and a gateway that wraps every answer in a 200 reports
 * its failures inside the body; read as "absent" or "deleted", either would clear a fence while
 * the sandbox lives and mark the live generation released. Real HTTP servers: a tiny node:http
 * server answering exactly the bytes under test, and the local provisioner for its unknown route.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import {
  ErrorCode,
  ProvisionerUnavailableError,
  ProvisionerUnconfirmedError,
} from '../../functions/cleanup/errors.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { useLocalProvisionerFixture } from '../support/fixtures.ts';

const fixture = useLocalProvisionerFixture({ tempPrefix: 'rc-provisioner-origin-' });
const servers: Server[] = [];
const clients: ProvisionerClient[] = [];

afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.close()));
  await Promise.all(
    servers.splice(0).map((server) => new Promise<void>((resolve) => server.close(() => resolve()))),
  );
});

const REQUEST = { sandboxId: 'sbx-live', generation: 3, deleteTimeoutMs: 5_000 };

/**
 * A real HTTP server that answers every DELETE with this status, headers and body, and its listing
 * as the provisioner's: a 404 counts only from a base URL whose listing answers (contract v1.2
 * section 3; provisioner-verification.test.ts), and these tests are about the DELETE's answer.
 */
async function answering(status: number, headers: Record<string, string>, body: string): Promise<string> {
  const server = createServer((request, response) => {
    if (request.method === 'GET' && request.url === '/api/sandboxes') {
      response.writeHead(200, JSON_TYPE).end(JSON.stringify({ sandboxes: [], count: 0 }));
      return;
    }
    response.writeHead(status, headers);
    response.end(body);
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function deleteAt(baseUrl: string): Promise<ReleaseOutcome | Error> {
  const client = new ProvisionerClient(baseUrl);
  clients.push(client);
  return client.deleteSandbox(REQUEST).catch((error: Error) => error);
}

const JSON_TYPE = { 'content-type': 'application/json' };
const NGINX_404 =
  '<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>';

describe('a 404 or 410 is "no such sandbox" only when it is the provisioner\'s', () => {
  it.each([
    ['nginx default page (text/html)', 404, { 'content-type': 'text/html' }, NGINX_404],
    [
      'plain text from a framework',
      404,
      { 'content-type': 'text/plain' },
      'Cannot DELETE /api/sandboxes/sbx-live',
    ],
    ['HTML 410 from a CDN', 410, { 'content-type': 'text/html; charset=utf-8' }, '<h1>Gone</h1>'],
    ['a body with no Content-Type', 404, {}, 'not found'],
    ['JSON media type, body not JSON', 404, JSON_TYPE, '<html>404</html>'],
    [
      'JSON naming another sandbox',
      404,
      JSON_TYPE,
      JSON.stringify({ error: 'not found', sandbox_id: 'other' }),
    ],
  ])(
    '%s: PROVISIONER_UNCONFIRMED (dead letter with the reason), never ABSENT',
    async (_name, status, headers, body) => {
      const outcome = await deleteAt(await answering(status, headers, body));

      expect(outcome).toBeInstanceOf(ProvisionerUnconfirmedError);
      const error = outcome as ProvisionerUnconfirmedError;
      expect(error.code).toBe(ErrorCode.PROVISIONER_UNCONFIRMED);
      expect(error.retryable).toBe(false);
      expect(error.message).toContain('check SANDBOX_PROVISIONER_URL');
      expect(error.details).toMatchObject({ status, refusal: expect.any(String) });
    },
  );

  it.each([
    ['no body', 404, {}, ''],
    ['a JSON error', 404, JSON_TYPE, JSON.stringify({ error: 'not found' })],
    [
      'a JSON body naming this sandbox',
      410,
      JSON_TYPE,
      JSON.stringify({ error: 'gone', sandbox_id: 'sbx-live' }),
    ],
    [
      'a problem report',
      404,
      { 'content-type': 'application/problem+json' },
      JSON.stringify({ title: 'Not Found' }),
    ],
  ])('%s: ABSENT, a success', async (_name, status, headers, body) => {
    expect(await deleteAt(await answering(status, headers, body))).toBe(ReleaseOutcome.ABSENT);
  });

  it('the local provisioner answers an unknown ROUTE unlike an unknown SANDBOX, and the client tells them apart', async () => {
    const base = fixture.provisioner.url;

    // A wrong path prefix: the DELETE lands on a route the provisioner does not have.
    const wrongPrefix = await deleteAt(`${base}/wrong-prefix`);
    // The right URL, a sandbox that does not exist: the provisioner's own 404.
    const unknownSandbox = await deleteAt(base);

    expect(wrongPrefix).toBeInstanceOf(ProvisionerUnconfirmedError);
    expect(unknownSandbox).toBe(ReleaseOutcome.ABSENT);
  });
});

describe('a 200 confirms only when its JSON object says the delete happened, to this sandbox and generation', () => {
  it.each([
    [
      'GraphQL/JSON:API errors',
      { errors: [{ message: 'sandbox delete failed: node unreachable' }] },
      'errors',
    ],
    ['deleted: false', { deleted: false, sandbox_id: 'sbx-live' }, 'deleted: false'],
    ['status: failed', { status: 'failed', sandbox_id: 'sbx-live' }, 'status "failed"'],
    ['a status code of an HTTP error', { statusCode: 500, message: 'internal' }, 'statusCode 500'],
    ['another sandbox', { deleted: true, sandbox_id: 'sbx-other' }, 'names sandbox "sbx-other"'],
    ['another generation', { deleted: true, generation: 2 }, 'names generation 2'],
  ])('%s: PROVISIONER_UNCONFIRMED, never DELETED', async (_name, body, refusal) => {
    const outcome = await deleteAt(await answering(200, JSON_TYPE, JSON.stringify(body)));

    expect(outcome).toBeInstanceOf(ProvisionerUnconfirmedError);
    expect((outcome as ProvisionerUnconfirmedError).details.refusal).toContain(refusal);
  });

  it.each([
    ['status: pending', { status: 'pending' }],
    ['status: accepted', { status: 'Accepted', sandbox_id: 'sbx-live' }],
    ['status: queued', { status: 'queued' }],
  ])('%s: not done yet, retried like a 202 with the delete-in-flight window kept', async (_name, body) => {
    const outcome = await deleteAt(await answering(200, JSON_TYPE, JSON.stringify(body)));

    expect(outcome).toBeInstanceOf(ProvisionerUnavailableError);
    const error = outcome as ProvisionerUnavailableError;
    expect(error.retryable).toBe(true);
    expect(error.deleteMayStillAct).toBe(true);
  });

  it.each([
    ["the local provisioner's shape", { deleted: true, generation: 3 }],
    [
      'this sandbox and generation as a string',
      { sandbox_id: 'sbx-live', generation: '3', status: 'deleted' },
    ],
    ['an empty object', {}],
    ['an empty errors list', { errors: [], deleted: true }],
  ])('%s: DELETED', async (_name, body) => {
    expect(await deleteAt(await answering(200, JSON_TYPE, JSON.stringify(body)))).toBe(
      ReleaseOutcome.DELETED,
    );
  });
});
