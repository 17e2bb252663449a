/**
 * Contract v1.2 section 3: a 404 or 410 counts as gone only from a base URL known to be the
 * provisioner, one whose `GET /api/sandboxes` answers the listing. A web framework's own "no such
 * route" (FastAPI: `404 {"detail":"Not Found"}`, JSON like a provisioner's) at a wrong path prefix
 * is no confirmation. Against real HTTP servers scripted per test (test/support/scripted-provisioner.ts)
 * and the local provisioner; test/platform/ runs the same against a real FastAPI app.
 */
import type { ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import {
  ProvisionerClient,
  type ProvisionerClientOptions,
} from '../../functions/adapters/provisioner-client.ts';
import {
  deleteMayStillAct,
  ErrorCode,
  ProvisionerDeleteTimeoutError,
  ProvisionerUnavailableError,
  ProvisionerUnconfirmedError,
  ProvisionerUrlUnverifiedError,
} from '../../functions/cleanup/errors.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { useLocalProvisionerFixture } from '../support/fixtures.ts';
import { rejectionOf } from '../support/probes.ts';
import {
  EMPTY_LISTING,
  FRAMEWORK_NOT_FOUND,
  json,
  type ScriptedProvisioner,
  startScriptedProvisioner,
} from '../support/scripted-provisioner.ts';

const fixture = useLocalProvisionerFixture({ tempPrefix: 'rc-provisioner-verify-' });
const servers: ScriptedProvisioner[] = [];
const clients: ProvisionerClient[] = [];

afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.close()));
  await Promise.all(servers.splice(0).map((server) => server.close()));
});

async function scripted(options: Parameters<typeof startScriptedProvisioner>[0] = {}) {
  const server = await startScriptedProvisioner(options);
  servers.push(server);
  return server;
}

function clientOf(baseUrl: string, options: ProvisionerClientOptions = {}): ProvisionerClient {
  const client = new ProvisionerClient(baseUrl, options);
  clients.push(client);
  return client;
}

const remove = (client: ProvisionerClient, sandboxId = 'sbx-verify', deleteTimeoutMs = 5_000) =>
  client.deleteSandbox({ sandboxId, generation: 4, deleteTimeoutMs });

const methods = (server: ScriptedProvisioner) => server.requests.map(({ method }) => method);

describe('a 404 or 410 from a base URL whose listing is not the provisioner', () => {
  it.each([
    [
      "FastAPI's JSON 404",
      FRAMEWORK_NOT_FOUND,
      /answered 404 \(application\/json\) "Not Found", not the provisioner's listing/,
    ],
    [
      'a 405',
      json(405, { detail: 'Method Not Allowed' }),
      /answered 405 \(application\/json\) "Method Not Allowed"/,
    ],
    [
      'an HTML page with 200',
      (_request: unknown, response: ServerResponse) => {
        response.writeHead(200, { 'content-type': 'text/html' }).end('<html>It works!</html>');
      },
      /answered 200, but the provisioner listing is not JSON/,
    ],
    [
      'JSON of another shape',
      json(200, { status: 'ok' }),
      /answered 200, but the provisioner listing has no "sandboxes" array/,
    ],
  ])(
    'with %s: PROVISIONER_URL_UNVERIFIED, a dead letter naming the URL and the listing',
    async (_name, listing, said) => {
      const server = await scripted({ deleteAnswer: FRAMEWORK_NOT_FOUND, listAnswer: listing });
      const refused: ProvisionerUrlUnverifiedError[] = [];
      const client = clientOf(server.url, { onUrlUnverified: (error) => refused.push(error) });

      const error = await rejectionOf(remove(client));

      expect(error).toBeInstanceOf(ProvisionerUrlUnverifiedError);
      expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_URL_UNVERIFIED, retryable: false });
      expect((error as Error).message).toMatch(said);
      expect((error as Error).message).toContain(
        `${server.url} is not known to be the provisioner: GET ${server.url}/api/sandboxes`,
      );
      expect(refused).toEqual([error]);
      // The DELETE was answered: nothing of it can still act, the scope's quarantine may end.
      expect(deleteMayStillAct(error)).toBe(false);
      expect(methods(server)).toEqual(['DELETE', 'GET']);
    },
  );

  it('names the base URL without its userinfo', async () => {
    const server = await scripted({ deleteAnswer: FRAMEWORK_NOT_FOUND, listAnswer: FRAMEWORK_NOT_FOUND });
    const withUserinfo = server.url.replace('http://', 'http://admin:pw-Hq8z@');

    const error = (await rejectionOf(
      remove(clientOf(`${withUserinfo}/v1`)),
    )) as ProvisionerUrlUnverifiedError;

    expect(error.message).toContain(`${server.url}/v1 is not known to be the provisioner`);
    expect(JSON.stringify({ message: error.message, details: error.details })).not.toMatch(/admin|pw-Hq8z/);
  });

  it('a 410 is held to the same rule', async () => {
    const server = await scripted({
      deleteAnswer: json(410, { detail: 'Gone' }),
      listAnswer: FRAMEWORK_NOT_FOUND,
    });
    expect(await rejectionOf(remove(clientOf(server.url)))).toBeInstanceOf(ProvisionerUrlUnverifiedError);
  });

  it('is refused again at every 404 until the route is fixed, then the same client takes 404s as gone', async () => {
    const server = await scripted({ deleteAnswer: FRAMEWORK_NOT_FOUND, listAnswer: FRAMEWORK_NOT_FOUND });
    const client = clientOf(server.url);

    expect(await rejectionOf(remove(client))).toBeInstanceOf(ProvisionerUrlUnverifiedError);
    expect(await rejectionOf(remove(client))).toBeInstanceOf(ProvisionerUrlUnverifiedError);
    server.onList(EMPTY_LISTING);
    expect(await remove(client)).toBe(ReleaseOutcome.ABSENT);

    expect(methods(server)).toEqual(['DELETE', 'GET', 'DELETE', 'GET', 'DELETE', 'GET']);
  });
});

describe('a listing that fails as a request can', () => {
  it('a 503: a retryable failure (fence kept), and the next attempt lists again', async () => {
    const server = await scripted({ listAnswer: json(503, { error: 'starting' }) });
    const client = clientOf(server.url);

    const error = await rejectionOf(remove(client));

    expect(error).toBeInstanceOf(ProvisionerUnavailableError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_UNAVAILABLE,
      retryable: true,
      details: { status: 404, listingStatus: 503, verification: 'list_unavailable' },
    });
    expect((error as Error).message).toContain(
      `GET ${server.url}/api/sandboxes (checking that ${server.url} is the provisioner and the sandbox is gone) failed`,
    );
    server.onList(EMPTY_LISTING);
    expect(await remove(client)).toBe(ReleaseOutcome.ABSENT);
  });

  it('a reset connection: retryable, and the DELETE is not sent again for it', async () => {
    const server = await scripted({
      listAnswer: (request) => {
        request.socket.resetAndDestroy();
      },
    });

    const error = await rejectionOf(remove(clientOf(server.url)));

    expect(error).toBeInstanceOf(ProvisionerUnavailableError);
    expect(error).toMatchObject({ retryable: true });
    expect(methods(server)).toEqual(['DELETE', 'GET']);
  });

  it('a listing that never answers: the DELETE times out within its own bound', async () => {
    const server = await scripted({ listAnswer: () => {} });
    const started = performance.now();

    const error = await rejectionOf(remove(clientOf(server.url), 'sbx-verify', 400));

    expect(error).toBeInstanceOf(ProvisionerDeleteTimeoutError);
    expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_DELETE_TIMEOUT, retryable: true });
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});

describe('a 404 checked by a listing taken after it', () => {
  it('concurrent 404s share listings, and each is followed by one that started after it', async () => {
    const server = await scripted();
    const client = clientOf(server.url);

    const outcomes = await Promise.all(['a', 'b', 'c', 'd', 'e'].map((id) => remove(client, `sbx-${id}`)));
    expect(outcomes).toEqual(Array(5).fill(ReleaseOutcome.ABSENT));

    const seen = methods(server);
    const lastListing = seen.lastIndexOf('GET');
    expect(seen.filter((method) => method === 'DELETE')).toHaveLength(5);
    expect(seen.filter((method) => method === 'GET').length).toBeLessThanOrEqual(5);
    // The server saw every DELETE before some listing: none was vouched for by an earlier one.
    seen.forEach((method, index) => {
      if (method === 'DELETE') expect(lastListing).toBeGreaterThan(index);
    });
  });

  it("a later 404 is not vouched for by an earlier listing, the reclaimer's included", async () => {
    const server = await scripted();
    const client = clientOf(server.url);

    await client.listSandboxes({ timeoutMs: 5_000 });
    expect(await remove(client)).toBe(ReleaseOutcome.ABSENT);
    expect(await remove(client)).toBe(ReleaseOutcome.ABSENT);

    expect(methods(server)).toEqual(['GET', 'DELETE', 'GET', 'DELETE', 'GET']);
  });

  it('the route went away after a listing (a redeploy): the next 404 is refused, not trusted', async () => {
    const server = await scripted();
    const client = clientOf(server.url);
    expect(await remove(client)).toBe(ReleaseOutcome.ABSENT);

    server.onList(FRAMEWORK_NOT_FOUND);
    // An exact-path proxy with no route: an empty 404.
    server.onDelete((_request, response) => {
      response.writeHead(404).end();
    });
    expect(await rejectionOf(remove(client))).toBeInstanceOf(ProvisionerUrlUnverifiedError);
  });

  it('a gateway that routes the listing but not the DELETE: the listing still names the sandbox, no confirmation', async () => {
    const server = await scripted({
      // API Gateway's answer to a route it does not have.
      deleteAnswer: json(404, { message: 'Not Found' }),
      listAnswer: json(200, {
        sandboxes: [{ sandbox_id: 'sbx-verify', sandbox_url: 'http://sbx-verify:8000', status: 'running' }],
        count: 1,
      }),
    });
    const error = await rejectionOf(remove(clientOf(server.url)));
    expect(error).toBeInstanceOf(ProvisionerUnconfirmedError);
    expect((error as ProvisionerUnconfirmedError).code).toBe(ErrorCode.PROVISIONER_UNCONFIRMED);
    expect((error as Error).message).toMatch(/still lists sandbox sbx-verify/);
    expect((error as Error).message).toContain(server.url);
  });

  it('a 200 confirmation needs no listing at all', async () => {
    const server = await scripted({ deleteAnswer: json(200, { ok: true }) });
    expect(await remove(clientOf(server.url))).toBe(ReleaseOutcome.DELETED);
    expect(methods(server)).toEqual(['DELETE']);
  });

  it('the local provisioner: its unknown sandbox is gone, its unknown route is refused before any listing', async () => {
    const right = clientOf(fixture.provisioner.url);
    const wrong = clientOf(`${fixture.provisioner.url}/v1`);

    expect(await remove(right, 'sbx-never-created')).toBe(ReleaseOutcome.ABSENT);
    // Its unknown route answers a plain-text page: refused on the answer alone, as before.
    expect(await rejectionOf(remove(wrong, 'sbx-never-created'))).toBeInstanceOf(ProvisionerUnconfirmedError);
    const listings = fixture.provisioner.audit().filter((entry) => entry.method === 'GET');
    expect(listings.map((entry) => entry.path)).toEqual(['/api/sandboxes']);
  });
});

describe('an HTML or text 404 page', () => {
  it('is refused as PROVISIONER_UNCONFIRMED on its own, whatever the listing says', async () => {
    const server = await scripted({
      deleteAnswer: (_request, response) => {
        response.writeHead(404, { 'content-type': 'text/html' }).end('<h1>404</h1>');
      },
    });
    expect(await rejectionOf(remove(clientOf(server.url)))).toBeInstanceOf(ProvisionerUnconfirmedError);
    expect(methods(server)).toEqual(['DELETE']);
  });
});
