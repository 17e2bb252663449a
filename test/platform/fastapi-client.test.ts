/**
 * The provisioner client against a real FastAPI provisioner that behaves as the platform's does
 * (test/platform/fastapi-provisioner/app.py, on Debian's uvicorn). FastAPI answers a route it
 * does not serve with `404 {"detail":"Not Found"}` in JSON: the same status and media type as a
 * provisioner's "no such sandbox". Contract v1.2 section 3: such a 404 counts as gone only from a
 * base URL whose `GET /api/sandboxes` answers the listing.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import {
  ErrorCode,
  ProvisionerAuthenticationError,
  ProvisionerUrlUnverifiedError,
} from '../../functions/cleanup/errors.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import {
  type FastApiProvisioner,
  type FastApiProvisionerOptions,
  startFastApiProvisioner,
} from '../support/fastapi-provisioner.ts';
import { rejectionOf } from '../support/probes.ts';

const apps: FastApiProvisioner[] = [];
const clients: ProvisionerClient[] = [];
let platformLike: FastApiProvisioner;
let gateway: FastApiProvisioner;
let absentIs404: FastApiProvisioner;
let guarded: FastApiProvisioner;
const TOKEN = 'fastapi-client-token.Zq9';

async function app(options: FastApiProvisionerOptions): Promise<FastApiProvisioner> {
  const started = await startFastApiProvisioner(options);
  apps.push(started);
  return started;
}

beforeAll(async () => {
  [platformLike, gateway, absentIs404, guarded] = await Promise.all([
    app({}),
    app({ prefix: '/provisioner' }),
    app({ absentStatus: 404 }),
    app({ token: TOKEN }),
  ]);
});
afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.close()));
  await Promise.all(apps.map((started) => started.clearRequests()));
});
afterAll(async () => {
  await Promise.all(apps.map((started) => started.stop()));
});

function clientOf(baseUrl: string, options: ConstructorParameters<typeof ProvisionerClient>[1] = {}) {
  const client = new ProvisionerClient(baseUrl, options);
  clients.push(client);
  return client;
}

async function createAt(target: FastApiProvisioner, sandboxId: string, token?: string): Promise<void> {
  const response = await fetch(`${target.url}/api/sandboxes`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 'thread', user_id: 'user' }),
  });
  expect(response.status).toBe(200);
}

const remove = (client: ProvisionerClient, sandboxId: string) =>
  client.deleteSandbox({ sandboxId, generation: 1, deleteTimeoutMs: 5_000 });

describe('a base URL one path segment off never confirms a delete', () => {
  it.each([
    ['a segment appended (/v1)', () => `${platformLike.url}/v1`, () => platformLike],
    ['a gateway prefix missing', () => gateway.origin, () => gateway],
  ])(
    '%s: PROVISIONER_URL_UNVERIFIED naming the URL and what its listing answered; the sandbox lives',
    async (_name, wrongUrl, target) => {
      await createAt(target(), 'sbx-wrong-url');
      const refused: ProvisionerUrlUnverifiedError[] = [];
      const client = clientOf(wrongUrl(), { onUrlUnverified: (error) => refused.push(error) });

      const error = await rejectionOf(remove(client, 'sbx-wrong-url'));

      expect(error).toBeInstanceOf(ProvisionerUrlUnverifiedError);
      expect(error).toMatchObject({
        code: ErrorCode.PROVISIONER_URL_UNVERIFIED,
        retryable: false,
        details: { status: 404, listingStatus: 404, listingProblem: '"Not Found"' },
      });
      expect((error as Error).message).toContain(
        `GET ${wrongUrl()}/api/sandboxes answered 404 (application/json) "Not Found"`,
      );
      expect((error as Error).message).toContain('check SANDBOX_PROVISIONER_URL');
      expect(refused).toEqual([error]);
      // What FastAPI saw: the DELETE and the verification, both on a route it does not have.
      const seen = (await target().requests()).filter(({ method }) => method !== 'POST');
      expect(seen.map(({ method, status }) => `${method} ${status}`)).toEqual(['DELETE 404', 'GET 404']);
      expect(await target().sandboxIds()).toContain('sbx-wrong-url');
    },
  );
});

describe('the right base URL', () => {
  it("confirms the platform provisioner's 200 without any extra request", async () => {
    await createAt(platformLike, 'sbx-right-url');
    const client = clientOf(platformLike.url);

    expect(await remove(client, 'sbx-right-url')).toBe(ReleaseOutcome.DELETED);
    // Unknown to it: the platform's provisioner answers 200 here too.
    expect(await remove(client, 'sbx-never-made')).toBe(ReleaseOutcome.DELETED);

    expect((await platformLike.requests()).map(({ method }) => method)).toEqual(['POST', 'DELETE', 'DELETE']);
    expect(await platformLike.sandboxIds()).not.toContain('sbx-right-url');
  });

  it('takes a FastAPI "Sandbox not found" 404 as gone after a listing taken after it, one per 404', async () => {
    const client = clientOf(absentIs404.url);

    for (const sandboxId of ['sbx-gone-1', 'sbx-gone-2']) {
      expect(await remove(client, sandboxId)).toBe(ReleaseOutcome.ABSENT);
    }

    const seen = await absentIs404.requests();
    expect(seen.map(({ method, status }) => `${method} ${status}`)).toEqual([
      'DELETE 404',
      'GET 200',
      'DELETE 404',
      'GET 200',
    ]);
  });

  it('shares one listing among concurrent 404s', async () => {
    const client = clientOf(absentIs404.url);

    const outcomes = await Promise.all(['sbx-c-1', 'sbx-c-2', 'sbx-c-3'].map((id) => remove(client, id)));
    expect(outcomes).toEqual([ReleaseOutcome.ABSENT, ReleaseOutcome.ABSENT, ReleaseOutcome.ABSENT]);
    const listings = (await absentIs404.requests()).filter(({ method }) => method === 'GET');
    // Every 404 was answered before the first listing started, or waited for a later one.
    expect(listings.length).toBeGreaterThanOrEqual(1);
    expect(listings.length).toBeLessThanOrEqual(3);
  });

  it("reads the platform's listing (no generation) for the reclaimer; an earlier listing vouches for no later 404", async () => {
    await createAt(absentIs404, 'sbx-listed');
    const client = clientOf(absentIs404.url);

    const listed = await client.listSandboxes({ timeoutMs: 5_000 });
    expect(listed).toContainEqual(
      expect.objectContaining({ sandboxId: 'sbx-listed', generation: null, status: 'running' }),
    );
    expect(await remove(client, 'sbx-never-made')).toBe(ReleaseOutcome.ABSENT);
    expect((await absentIs404.requests()).map(({ method }) => method)).toEqual([
      'POST',
      'GET',
      'DELETE',
      'GET',
    ]);
  });
});

describe('a provisioner that requires a bearer token', () => {
  it('is sent the token on every request, the verification included', async () => {
    await createAt(guarded, 'sbx-guarded', TOKEN);
    const client = clientOf(guarded.url, {
      token: { origin: 'SANDBOX_PROVISIONER_TOKEN', value: TOKEN, reread: async () => TOKEN },
    });

    expect(await remove(client, 'sbx-guarded')).toBe(ReleaseOutcome.DELETED);
    expect(await client.listSandboxes({ timeoutMs: 5_000 })).toEqual([]);

    const seen = (await guarded.requests()).filter(({ method }) => method !== 'POST');
    expect(seen.map(({ method, status, bearer }) => `${method} ${status} ${bearer}`)).toEqual([
      'DELETE 200 valid',
      'GET 200 valid',
    ]);
  });

  it.each([
    [
      'a wrong token',
      'wrong-token-Xk2',
      /to the token from SANDBOX_PROVISIONER_TOKEN, also after reading it again/,
    ],
    ['no token', undefined, /no token is configured/],
  ])('refuses %s: a retryable PROVISIONER_AUTH_FAILED that names no token', async (_name, token, why) => {
    await createAt(guarded, 'sbx-guarded-kept', TOKEN);
    const client = clientOf(
      guarded.url,
      token === undefined
        ? {}
        : { token: { origin: 'SANDBOX_PROVISIONER_TOKEN', value: token, reread: async () => token } },
    );

    const error = await rejectionOf(remove(client, 'sbx-guarded-kept'));

    expect(error).toBeInstanceOf(ProvisionerAuthenticationError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_AUTH_FAILED,
      retryable: true,
      details: { status: 401 },
    });
    expect((error as Error).message).toMatch(why);
    const reported = JSON.stringify({
      message: (error as Error).message,
      details: (error as { details: unknown }).details,
    });
    expect(reported).not.toContain(TOKEN);
    if (token) expect(reported).not.toContain(token);
    expect(await guarded.sandboxIds()).toContain('sbx-guarded-kept');
  });
});
