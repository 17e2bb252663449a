/**
 * The provisioner's bearer token (contract v1.2, sections 3 and 4): sent on every request as
 * `Authorization: Bearer <token>`; a 401 reads it again once and resends the request once if it
 * changed (a rotation), like a refused database password; an unchanged token fails retryably with
 * PROVISIONER_AUTH_FAILED. The token never appears in an error, even when the provisioner echoes
 * it. Against real HTTP servers: the local provisioner requiring a token, and scripted ones.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ProvisionerTokenUnreadableError } from '../../functions/adapters/errors.ts';
import {
  ProvisionerClient,
  type ProvisionerClientOptions,
  type ProvisionerToken,
} from '../../functions/adapters/provisioner-client.ts';
import {
  deleteMayStillAct,
  ErrorCode,
  ProvisionerAuthenticationError,
} from '../../functions/cleanup/errors.ts';
import { ReclaimRefusal, ReclaimRefusedError } from '../../functions/cleanup/reclaim-listing.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { createSandboxAt, rejectionOf } from '../support/probes.ts';
import { json, type ScriptedProvisioner, startScriptedProvisioner } from '../support/scripted-provisioner.ts';

const TOKEN = 'alpha-token.Vb3n';
const ROTATED = 'beta-token.Wc4p';
let provisioner: LocalProvisioner;
let rootDir: string;
const servers: ScriptedProvisioner[] = [];
const clients: ProvisionerClient[] = [];

beforeAll(async () => {
  rootDir = await mkdtemp(join(tmpdir(), 'rc-provisioner-token-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 200, token: TOKEN });
});
afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.close()));
  await Promise.all(servers.splice(0).map((server) => server.close()));
});
afterAll(async () => {
  await provisioner?.stop();
  if (rootDir) await rm(rootDir, { recursive: true, force: true });
});

/** A token whose re-reads answer `next` (the parameter after a rotation), counted. */
function tokenOf(value: string, next: () => Promise<string> = async () => value) {
  const token = {
    origin: 'SSM parameter /runtime-cleanup/test/sandbox-provisioner-token',
    value,
    rereads: 0,
    reread: async () => {
      token.rereads += 1;
      return next();
    },
  };
  return token satisfies ProvisionerToken;
}

function clientOf(baseUrl: string, options: ProvisionerClientOptions = {}): ProvisionerClient {
  const client = new ProvisionerClient(baseUrl, options);
  clients.push(client);
  return client;
}

/** A provisioner that accepts only `accepted()` as its token (its listing verifies a 404). */
async function guarded(accepted: () => string, deleteAnswer = json(200, { ok: true })) {
  const server = await startScriptedProvisioner({ deleteAnswer, acceptedToken: accepted });
  servers.push(server);
  return server;
}

const remove = (client: ProvisionerClient, sandboxId = 'sbx-token') =>
  client.deleteSandbox({ sandboxId, generation: 1, deleteTimeoutMs: 5_000 });

describe('the local provisioner with a required token', () => {
  it('serves a client sending it, and refuses one without: 401, and the sandbox lives', async () => {
    const sandboxId = 'sbx-local-token';
    const generation = await createSandboxAt(provisioner.url, { sandboxId, threadId: 't', uid: 'u' }, TOKEN);
    const without = clientOf(provisioner.url);
    const withToken = clientOf(provisioner.url, { token: tokenOf(TOKEN) });

    const error = await rejectionOf(without.deleteSandbox({ sandboxId, generation, deleteTimeoutMs: 5_000 }));
    expect(error).toBeInstanceOf(ProvisionerAuthenticationError);
    expect(provisioner.sandbox(sandboxId)?.alive).toBe(true);

    expect(await withToken.listSandboxes({ timeoutMs: 5_000 })).toContainEqual(
      expect.objectContaining({ sandboxId }),
    );
    expect(await withToken.deleteSandbox({ sandboxId, generation, deleteTimeoutMs: 5_000 })).toBe(
      ReleaseOutcome.DELETED,
    );
    const statuses = provisioner
      .audit()
      .filter((entry) => entry.sandboxId === sandboxId || entry.method === 'GET')
      .map((entry) => `${entry.method} ${entry.status}`);
    expect(statuses).toEqual(['POST 201', 'DELETE 401', 'GET 200', 'DELETE 200']);
  });
});

describe('every request carries the token', () => {
  it('the DELETE, the verification of a 404 and the listing', async () => {
    const server = await guarded(() => TOKEN, json(404, { error: 'no such sandbox' }));
    const client = clientOf(server.url, { token: tokenOf(TOKEN) });

    expect(await remove(client)).toBe(ReleaseOutcome.ABSENT);
    await client.listSandboxes({ timeoutMs: 5_000 });

    expect(server.requests.map(({ method, bearer }) => `${method} ${bearer}`)).toEqual([
      `DELETE ${TOKEN}`,
      `GET ${TOKEN}`,
      `GET ${TOKEN}`,
    ]);
  });

  it('and none is sent when none is configured', async () => {
    const server = await startScriptedProvisioner({ deleteAnswer: json(200, { ok: true }) });
    servers.push(server);
    await remove(clientOf(server.url));
    expect(server.requests[0]?.bearer).toBeUndefined();
  });
});

describe('a 401', () => {
  it('after a rotation: the token is read again once and the request resent once with the new one', async () => {
    const server = await guarded(() => ROTATED);
    const token = tokenOf(TOKEN, async () => ROTATED);
    const client = clientOf(server.url, { token });

    expect(await remove(client)).toBe(ReleaseOutcome.DELETED);
    expect(await remove(client, 'sbx-token-2')).toBe(ReleaseOutcome.DELETED);

    expect(token.rereads).toBe(1);
    expect(server.requests.map(({ bearer }) => bearer)).toEqual([TOKEN, ROTATED, ROTATED]);
  });

  it('with an unchanged token: PROVISIONER_AUTH_FAILED, retryable, after one read and no resend', async () => {
    const server = await guarded(() => ROTATED);
    const token = tokenOf(TOKEN);

    const error = await rejectionOf(remove(clientOf(server.url, { token })));

    expect(error).toBeInstanceOf(ProvisionerAuthenticationError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_AUTH_FAILED,
      retryable: true,
      details: { status: 401, tokenOrigin: token.origin },
    });
    expect((error as Error).message).toContain(
      `to the token from ${token.origin}, also after reading it again`,
    );
    // Refused before it acted: the scope's delete-in-flight window may end.
    expect(deleteMayStillAct(error)).toBe(false);
    expect(token.rereads).toBe(1);
    expect(server.requests).toHaveLength(1);
  });

  it('again with the token read anew: PROVISIONER_AUTH_FAILED after exactly two requests', async () => {
    const server = await guarded(() => 'gamma-token');
    const token = tokenOf(TOKEN, async () => ROTATED);

    const error = await rejectionOf(remove(clientOf(server.url, { token })));

    expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_AUTH_FAILED, retryable: true });
    expect((error as Error).message).toContain('also to the one read again after a 401');
    expect(server.requests.map(({ bearer }) => bearer)).toEqual([TOKEN, ROTATED]);
  });

  it('when the token cannot be read again: that failure, retryable', async () => {
    const server = await guarded(() => ROTATED);
    const unreadable = new ProvisionerTokenUnreadableError(
      'cannot read SANDBOX_PROVISIONER_TOKEN from SSM parameter /p: AccessDeniedException',
    );
    const token = tokenOf(TOKEN, async () => {
      throw unreadable;
    });

    expect(await rejectionOf(remove(clientOf(server.url, { token })))).toBe(unreadable);
  });

  it('on the listing: the reclaim run is refused as unavailable, naming PROVISIONER_AUTH_FAILED', async () => {
    const server = await guarded(() => ROTATED);

    const error = await rejectionOf(
      clientOf(server.url, { token: tokenOf(TOKEN) }).listSandboxes({ timeoutMs: 5_000 }),
    );

    expect(error).toBeInstanceOf(ReclaimRefusedError);
    expect(error).toMatchObject({
      reason: ReclaimRefusal.LIST_UNAVAILABLE,
      details: { errorCode: ErrorCode.PROVISIONER_AUTH_FAILED },
    });
    expect((error as Error).message).not.toContain(TOKEN);
  });
});

describe('the token never appears in what the client reports', () => {
  it('even when the provisioner echoes the Authorization header into its answer', async () => {
    const server = await startScriptedProvisioner({
      deleteAnswer: (request, response) => {
        response
          .writeHead(500, { 'content-type': 'application/json' })
          .end(
            JSON.stringify({ error: `backend refused ${request.headers.authorization} (token ${TOKEN})` }),
          );
      },
    });
    servers.push(server);

    const error = (await rejectionOf(remove(clientOf(server.url, { token: tokenOf(TOKEN) })))) as Error & {
      details: Record<string, unknown>;
    };

    expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_UNAVAILABLE });
    expect(error.message).toContain('backend refused');
    expect(JSON.stringify({ message: error.message, details: error.details })).not.toContain(TOKEN);
  });
});
