/**
 * The provisioner client against real HTTP servers: the local provisioner (real sandboxes, and
 * faults for the misbehaviours it can produce) and, for replies no honest provisioner sends, a
 * tiny hostile node:http server written here. Each contract reply maps to one outcome or one
 * error class with a stable code and the right `retryable`.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { type AddressInfo, createServer as createTcpServer, type Socket } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { MAX_RESPONSE_BODY_BYTES, ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import {
  CleanupTimeoutError,
  ErrorCode,
  GenerationAnomalyError,
  InvalidMessageError,
  ProvisionerBadResponseError,
  ProvisionerConnectionError,
  ProvisionerDeleteTimeoutError,
  ProvisionerRejectedError,
  ProvisionerThrottledError,
  ProvisionerUnavailableError,
  ProvisionerUnconfirmedError,
} from '../../functions/cleanup/errors.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { useLocalProvisionerFixture } from '../support/fixtures.ts';
import { createSandboxAt, deletesOf, rejectionOf } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

const fixture = useLocalProvisionerFixture({ tempPrefix: 'rc-provisioner-client-' });
let client: ProvisionerClient;
const hostileServers: HostileServer[] = [];
const extraClients: ProvisionerClient[] = [];
let nextId = 0;

beforeAll(() => {
  client = new ProvisionerClient(fixture.provisioner.url);
});
afterEach(async () => {
  await Promise.all(hostileServers.splice(0).map((server) => server.close()));
  await Promise.all(extraClients.splice(0).map((other) => other.close()));
});
afterAll(async () => {
  await client?.close();
});

function freshId(): string {
  nextId += 1;
  return `sbx-client-${process.pid}-${nextId}`;
}

async function liveSandbox(): Promise<{ sandboxId: string; generation: number }> {
  const sandboxId = freshId();
  const generation = await createSandboxAt(fixture.provisioner.url, {
    sandboxId,
    threadId: 'thread',
    uid: 'user',
  });
  return { sandboxId, generation };
}

function remove(
  sandboxId: string,
  generation: number,
  options: { deleteTimeoutMs?: number; signal?: AbortSignal } = {},
) {
  return client.deleteSandbox({
    sandboxId,
    generation,
    deleteTimeoutMs: options.deleteTimeoutMs ?? 5_000,
    ...(options.signal ? { signal: options.signal } : {}),
  });
}

// --- A hostile provisioner ---------------------------------------------------------------------

interface HostileServer {
  url: string;
  /** Raw request targets as they arrived on the wire (path and query, still percent-encoded). */
  targets: string[];
  close(): Promise<void>;
}

async function startHostileServer(
  answer: (request: IncomingMessage, response: ServerResponse) => void,
): Promise<HostileServer> {
  const targets: string[] = [];
  const server: Server = createServer((request, response) => {
    targets.push(request.url ?? '');
    answer(request, response);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const hostile: HostileServer = {
    url: `http://127.0.0.1:${port}`,
    targets,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  hostileServers.push(hostile);
  return hostile;
}

function clientOf(baseUrl: string): ProvisionerClient {
  const made = new ProvisionerClient(baseUrl);
  extraClients.push(made);
  return made;
}

// --- Contract replies ----------------------------------------------------------------------------

describe('contract replies (contract §3)', () => {
  it('maps 200 to DELETED, and the sandbox is really gone', async () => {
    const { sandboxId, generation } = await liveSandbox();
    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.DELETED);
    expect(fixture.provisioner.sandbox(sandboxId)).toBeUndefined();
  });

  it('maps 404 (no such sandbox) to ABSENT, a success', async () => {
    expect(await remove(freshId(), 1)).toBe(ReleaseOutcome.ABSENT);
  });

  it('maps 409 with a newer current generation to SUPERSEDED and leaves the newer sandbox alone', async () => {
    const { sandboxId, generation } = await liveSandbox();
    await remove(sandboxId, generation);
    const newer = await createSandboxAt(fixture.provisioner.url, {
      sandboxId,
      threadId: 'thread',
      uid: 'user',
    });

    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.SUPERSEDED);
    expect(fixture.provisioner.sandbox(sandboxId)?.generation).toBe(newer);
  });

  it('maps 409 with an older current generation to a non-retryable GenerationAnomalyError', async () => {
    const { sandboxId, generation } = await liveSandbox();

    const error = await rejectionOf(remove(sandboxId, generation + 4));

    expect(error).toBeInstanceOf(GenerationAnomalyError);
    expect(error).toMatchObject({
      code: ErrorCode.GENERATION_ANOMALY,
      retryable: false,
      details: { currentGeneration: generation, generation: generation + 4 },
    });
    expect(fixture.provisioner.sandbox(sandboxId)?.alive).toBe(true);
  });

  it.each([408, 500, 502, 503, 504])('maps %i to a retryable ProvisionerUnavailableError', async (status) => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status });

    const error = await rejectionOf(remove(sandboxId, generation));

    expect(error).toBeInstanceOf(ProvisionerUnavailableError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_UNAVAILABLE,
      retryable: true,
      details: { status },
      retryAfterSeconds: undefined,
    });
  });

  it('maps 429 to a retryable ProvisionerThrottledError, with no wait asked when no Retry-After is sent', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status: 429 });

    const error = await rejectionOf(remove(sandboxId, generation));

    expect(error).toBeInstanceOf(ProvisionerThrottledError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_THROTTLED,
      retryable: true,
      details: { status: 429 },
      retryAfterSeconds: undefined,
    });
    expect(fixture.provisioner.sandbox(sandboxId)?.alive).toBe(true);
  });

  it('maps 410 (gone) to ABSENT, a success: after a real delete, and for a sandbox that never was', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { gone: true });

    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.ABSENT);
    expect(fixture.provisioner.sandbox(sandboxId)).toBeUndefined();
    expect(deletesOf(fixture.provisioner, sandboxId).map((entry) => entry.status)).toEqual([410]);
    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.ABSENT);
  });

  // 401 is the token's (provisioner-token.test.ts): retryable, after reading the token again.
  it.each([400, 403, 405, 422])('maps %i to a non-retryable ProvisionerRejectedError', async (status) => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status });

    const error = await rejectionOf(remove(sandboxId, generation));

    expect(error).toBeInstanceOf(ProvisionerRejectedError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_REJECTED,
      retryable: false,
      details: { status },
    });
  });

  it.each([301, 302, 307])(
    'never counts %i as a confirmed delete (ProvisionerBadResponseError)',
    async (status) => {
      const { sandboxId, generation } = await liveSandbox();
      fixture.provisioner.setFault(sandboxId, { status });

      const error = await rejectionOf(remove(sandboxId, generation));

      expect(error).toBeInstanceOf(ProvisionerBadResponseError);
      expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_BAD_RESPONSE, details: { status } });
    },
  );

  it('does not follow a redirect: one request reaches the server, and the delete is not confirmed', async () => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(307, { location: '/api/sandboxes/elsewhere?generation=1' }).end();
    });

    const error = await rejectionOf(
      clientOf(hostile.url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 5_000 }),
    );

    expect(error).toBeInstanceOf(ProvisionerBadResponseError);
    expect(hostile.targets).toEqual(['/api/sandboxes/sbx?generation=1']);
  });
});

describe('409 bodies outside the contract', () => {
  it.each([
    ['an empty body', ''],
    ['a body that is not JSON', 'conflict!'],
    ['JSON without current_generation', '{"error":"conflict"}'],
    ['a non-numeric current_generation', '{"current_generation":"two"}'],
    ['a negative current_generation', '{"current_generation":-1}'],
    ['a fractional current_generation', '{"current_generation":1.5}'],
    ['an overflowing current_generation', '{"current_generation":1e400}'],
    ['a null current_generation', '{"current_generation":null}'],
    ['a JSON array', '[2]'],
  ])('refuses %s with ProvisionerBadResponseError', async (_name, body) => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status: 409, body });

    expect(await rejectionOf(remove(sandboxId, generation))).toBeInstanceOf(ProvisionerBadResponseError);
  });

  it('refuses a 409 naming the very generation being deleted', async () => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(409, { 'content-type': 'application/json' }).end('{"current_generation":3}');
    });

    const error = await rejectionOf(
      clientOf(hostile.url).deleteSandbox({ sandboxId: 'sbx', generation: 3, deleteTimeoutMs: 5_000 }),
    );

    expect(error).toBeInstanceOf(ProvisionerBadResponseError);
    expect(error).toMatchObject({ retryable: false, details: { status: 409, currentGeneration: 3 } });
    expect((error as Error).message).toContain('naming the generation being deleted (3)');
  });

  it('refuses an oversized 409 body without reading it all, even though it names a newer generation', async () => {
    const { sandboxId, generation } = await liveSandbox();
    await remove(sandboxId, generation);
    await createSandboxAt(fixture.provisioner.url, { sandboxId, threadId: 'thread', uid: 'user' });
    // The real answer, {"current_generation":2}, padded past the client's limit.
    fixture.provisioner.setFault(sandboxId, { oversizedBodyBytes: MAX_RESPONSE_BODY_BYTES * 4 });

    expect(await rejectionOf(remove(sandboxId, generation))).toBeInstanceOf(ProvisionerBadResponseError);
    expect(deletesOf(fixture.provisioner, sandboxId).at(-1)?.status).toBe(409);
  });
});

describe('Retry-After on 429 and 503 (contract v1.1 §3)', () => {
  it.each([429, 503])("carries a %i's delta-seconds Retry-After on the error", async (status) => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status, retryAfter: { seconds: 7, as: 'delta-seconds' } });

    const error = await rejectionOf(remove(sandboxId, generation));

    expect(error).toMatchObject({
      retryable: true,
      retryAfterSeconds: 7,
      details: { status, retryAfterSeconds: 7 },
    });
  });

  it.each([429, 503])("carries a %i's HTTP-date Retry-After as the seconds until then", async (status) => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status, retryAfter: { seconds: 30, as: 'http-date' } });

    const error = (await rejectionOf(remove(sandboxId, generation))) as { retryAfterSeconds: number };

    // The date has whole seconds and is computed when the answer is written.
    expect(error.retryAfterSeconds).toBeGreaterThanOrEqual(29);
    expect(error.retryAfterSeconds).toBeLessThanOrEqual(31);
  });

  it.each([408, 500, 502])(
    'ignores a Retry-After on %i, where the contract gives it no meaning',
    async (status) => {
      const { sandboxId, generation } = await liveSandbox();
      fixture.provisioner.setFault(sandboxId, { status, retryAfter: { seconds: 60, as: 'delta-seconds' } });

      expect(await rejectionOf(remove(sandboxId, generation))).toMatchObject({
        retryable: true,
        retryAfterSeconds: undefined,
      });
    },
  );

  it.each([
    ['a negative number', '-5', undefined],
    ['a fraction', '2.5', undefined],
    ['garbage', 'after lunch', undefined],
    ['a list of values', '5, 3600', undefined],
    ['a date in the past', 'Sun, 06 Nov 1994 08:49:37 GMT', 0],
    ['a huge number', '99999999999999999999', 1e20],
  ])('survives a hostile Retry-After (%s): still a retryable 429', async (_name, retryAfter, expected) => {
    const hostile = await startHostileServer((_request, response) => {
      response.setHeader('retry-after', retryAfter);
      response.writeHead(429, { 'content-type': 'application/json' }).end('{"error":"slow down"}');
    });

    const error = await rejectionOf(
      clientOf(hostile.url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 5_000 }),
    );

    expect(error).toBeInstanceOf(ProvisionerThrottledError);
    expect((error as ProvisionerThrottledError).retryAfterSeconds).toBe(expected);
  });
});

describe('a 200 must carry a JSON object (contract v1.1 §3)', () => {
  it("refuses a catch-all server's HTML page: non-retryable PROVISIONER_UNCONFIRMED, and nothing was deleted", async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, {
      status: 200,
      contentType: 'text/html; charset=utf-8',
      body: '<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>',
    });

    const error = await rejectionOf(remove(sandboxId, generation));

    expect(error).toBeInstanceOf(ProvisionerUnconfirmedError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_UNCONFIRMED,
      retryable: false,
      details: { status: 200, refusal: 'Content-Type "text/html; charset=utf-8" is not JSON' },
    });
    expect((error as Error).message).toContain('SANDBOX_PROVISIONER_URL');
    expect((error as Error).message).not.toContain('nginx');
    expect(fixture.provisioner.sandbox(sandboxId)?.alive).toBe(true);
  });

  it('refuses a 200 with an empty body', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status: 200, body: '' });

    expect(await rejectionOf(remove(sandboxId, generation))).toMatchObject({
      code: ErrorCode.PROVISIONER_UNCONFIRMED,
      retryable: false,
    });
    expect(fixture.provisioner.sandbox(sandboxId)?.alive).toBe(true);
  });

  it.each([
    ['no Content-Type', undefined, '{"deleted":true}', 'no Content-Type'],
    ['an empty JSON body', 'application/json', '', 'empty body'],
    ['a blank JSON body', 'application/json', '  \n', 'empty body'],
    ['a body that is not JSON', 'application/json', '<html></html>', 'body is not JSON'],
    ['a JSON array', 'application/json', '[]', 'body is JSON array, not an object'],
    ['a JSON string', 'application/json', '"deleted"', 'body is JSON string, not an object'],
    ['JSON null', 'application/json', 'null', 'body is JSON null, not an object'],
    ['a JSON number', 'application/json', '200', 'body is JSON number, not an object'],
    ['plain text saying OK', 'text/plain', 'OK', 'Content-Type "text/plain" is not JSON'],
  ])('refuses a 200 with %s', async (_name, contentType, body, refusal) => {
    const hostile = await startHostileServer((_request, response) => {
      if (contentType) response.setHeader('content-type', contentType);
      response.writeHead(200).end(body);
    });

    const error = await rejectionOf(
      clientOf(hostile.url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 5_000 }),
    );

    expect(error).toBeInstanceOf(ProvisionerUnconfirmedError);
    expect(error).toMatchObject({ retryable: false, details: { refusal } });
  });

  it.each([
    ['application/json', '{"deleted":true,"generation":1}'],
    ['application/json; charset=utf-8', '{}'],
    ['Application/JSON', ' {"status":"deleted"} '],
    ['application/vnd.provisioner+json', '{"detail":"deleted"}'],
    // Done said as a number, or inside an envelope: still a confirmation.
    ['application/json', '{"status":200}'],
    ['application/json', '{"data":{"status":"deleted"}}'],
    ['application/json', '{"result":"ok","status":null}'],
    ['application/json', '{"status":"already_deleted"}'],
    ['application/json', '{"status":"deleted","message":"Sandbox deleted; pending billing records cleared"}'],
  ])('accepts a 200 of type %s with a JSON object as DELETED', async (contentType, body) => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(200, { 'content-type': contentType }).end(body);
    });

    expect(
      await clientOf(hostile.url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 5_000 }),
    ).toBe(ReleaseOutcome.DELETED);
  });

  it('accepts a 204 with no body as DELETED', async () => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(204).end();
    });

    expect(
      await clientOf(hostile.url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 5_000 }),
    ).toBe(ReleaseOutcome.DELETED);
  });

  it('refuses a 200 whose body is over the limit (it cannot be checked), and a retry then hears ABSENT', async () => {
    const { sandboxId, generation } = await liveSandbox();
    // The local provisioner deletes for real, then pads its JSON answer to 20 MB.
    fixture.provisioner.setFault(sandboxId, { oversizedBodyBytes: 20 * 1024 * 1024, times: 1 });

    expect(await rejectionOf(remove(sandboxId, generation))).toMatchObject({
      code: ErrorCode.PROVISIONER_UNCONFIRMED,
      details: { refusal: `body larger than ${MAX_RESPONSE_BODY_BYTES} bytes` },
    });
    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.ABSENT);
  });

  it('does not buffer a 200 body: one that never ends is refused after reading at most the limit', async () => {
    let stopped = false;
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'application/json' });
      const chunk = Buffer.alloc(16 * 1024, 'x');
      const pump = () => {
        while (!stopped && !response.destroyed && response.write(chunk)) {}
        if (!stopped && !response.destroyed) response.once('drain', pump);
      };
      response.on('close', () => {
        stopped = true;
      });
      pump();
    });

    const error = await rejectionOf(
      clientOf(hostile.url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 10_000 }),
    );

    expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_UNCONFIRMED });
    // The client hung up on the endless body instead of draining it.
    await eventually('the client to close the connection', async () => stopped, 5_000);
  });
});

describe('connection failures and timeouts', () => {
  it('retries once after a reset before any answer, and succeeds if the second attempt is answered', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { reset: true, times: 1 });

    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.DELETED);
    expect(deletesOf(fixture.provisioner, sandboxId).map((entry) => entry.outcome)).toEqual([
      'reset',
      'answered',
    ]);
  });

  it('hears ABSENT on the retry when the reset only lost the answer of a delete that happened', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { reset: true, afterHandling: true, times: 1 });

    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.ABSENT);
    expect(fixture.provisioner.sandbox(sandboxId)).toBeUndefined();
  });

  it('fails with a retryable ProvisionerConnectionError after exactly one retry when every attempt is reset', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { reset: true });

    const error = await rejectionOf(remove(sandboxId, generation));

    expect(error).toBeInstanceOf(ProvisionerConnectionError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_CONNECTION,
      retryable: true,
      details: { reset: true },
    });
    expect(deletesOf(fixture.provisioner, sandboxId)).toHaveLength(2);
  });

  it('fails with a retryable ProvisionerConnectionError when the connection is refused', async () => {
    const closed = await startHostileServer(() => {});
    await closed.close();

    const error = await rejectionOf(
      clientOf(closed.url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 5_000 }),
    );

    expect(error).toBeInstanceOf(ProvisionerConnectionError);
    expect(error).toMatchObject({ retryable: true, details: { errorCode: 'ECONNREFUSED' } });
  });

  it('fails with ProvisionerDeleteTimeoutError when no answer comes within the delete timeout, and leaves nothing in flight', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { hang: true });

    const error = await rejectionOf(remove(sandboxId, generation, { deleteTimeoutMs: 150 }));

    expect(error).toBeInstanceOf(ProvisionerDeleteTimeoutError);
    expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_DELETE_TIMEOUT, retryable: true });
    await eventually(
      'the hung request to be closed',
      async () => fixture.provisioner.inFlight() === 0,
      5_000,
    );
    expect(deletesOf(fixture.provisioner, sandboxId)[0]?.outcome).toBe('aborted');
  });

  it('fails with ProvisionerDeleteTimeoutError when a 409 body, which decides the outcome, drips in past the delete timeout', async () => {
    const { sandboxId, generation } = await liveSandbox();
    await remove(sandboxId, generation);
    await createSandboxAt(fixture.provisioner.url, { sandboxId, threadId: 'thread', uid: 'user' });
    fixture.provisioner.setFault(sandboxId, { slowBodyMs: 3_000 });

    const error = await rejectionOf(remove(sandboxId, generation, { deleteTimeoutMs: 300 }));

    expect(error).toBeInstanceOf(ProvisionerDeleteTimeoutError);
    expect(error).toMatchObject({ code: ErrorCode.PROVISIONER_DELETE_TIMEOUT, retryable: true });
  });

  it('does not count a 200 whose body drips in past the delete timeout: a retryable timeout, and the retry hears ABSENT', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { slowBodyMs: 3_000, times: 1 });

    expect(await rejectionOf(remove(sandboxId, generation, { deleteTimeoutMs: 300 }))).toMatchObject({
      code: ErrorCode.PROVISIONER_DELETE_TIMEOUT,
      retryable: true,
    });
    expect(fixture.provisioner.sandbox(sandboxId)).toBeUndefined();
    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.ABSENT);
  });

  it("reports the caller's own abort reason, and a CleanupTimeoutError for a reason that is not a cleanup error", async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { hang: true });
    const reason = new CleanupTimeoutError('deadline', {});

    const withReason = new AbortController();
    const first = remove(sandboxId, generation, { signal: withReason.signal });
    await fixture.provisioner.waitForRequest((entry) => entry.sandboxId === sandboxId, 5_000);
    withReason.abort(reason);
    expect(await rejectionOf(first)).toBe(reason);

    const plain = new AbortController();
    const second = remove(sandboxId, generation, { signal: plain.signal });
    await eventually(
      'the second request to arrive',
      async () => deletesOf(fixture.provisioner, sandboxId).length === 2,
      5_000,
    );
    plain.abort();
    const error = await rejectionOf(second);
    expect(error).toBeInstanceOf(CleanupTimeoutError);
    expect(error).toMatchObject({ code: ErrorCode.CLEANUP_TIMEOUT, retryable: true });
    // Nobody retried behind the caller's back after an abort.
    await eventually('both requests to be closed', async () => fixture.provisioner.inFlight() === 0, 5_000);
    expect(deletesOf(fixture.provisioner, sandboxId)).toHaveLength(2);
  });
});

describe('the request path', () => {
  it('percent-encodes the sandbox id into one path segment: a/b?c#d% arrives as a%2Fb%3Fc%23d%25', async () => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(204).end();
    });

    await clientOf(hostile.url).deleteSandbox({
      sandboxId: 'a/b?c#d%',
      generation: 7,
      deleteTimeoutMs: 5_000,
    });

    expect(hostile.targets).toEqual(['/api/sandboxes/a%2Fb%3Fc%23d%25?generation=7']);
  });

  it('deletes a real sandbox whose id is a/b?c#d% (the provisioner decodes the same id)', async () => {
    const sandboxId = `${freshId()}/a/b?c#d%`;
    const generation = await createSandboxAt(fixture.provisioner.url, {
      sandboxId,
      threadId: 'thread',
      uid: 'user',
    });

    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.DELETED);
    expect(deletesOf(fixture.provisioner, sandboxId)).toHaveLength(1);
    expect(fixture.provisioner.sandbox(sandboxId)).toBeUndefined();
  });

  it('keeps the path prefix of the base URL', async () => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(204).end();
    });

    await clientOf(`${hostile.url}/provisioner/v1/`).deleteSandbox({
      sandboxId: 'sbx',
      generation: 2,
      deleteTimeoutMs: 5_000,
    });

    expect(hostile.targets).toEqual(['/provisioner/v1/api/sandboxes/sbx?generation=2']);
  });

  it.each([
    ['empty', ''],
    ['a dot segment', '.'],
    ['a dot-dot segment', '..'],
    ['a newline', 'sbx\nHost: evil'],
    ['a NUL', 'sbx\u0000'],
    ['a tab', 'sb\tx'],
    ['a DEL', 'sbx\u007f'],
    ['over 4096 characters (the message limit)', 'x'.repeat(4_097)],
  ])('rejects an id that is %s before sending anything', async (_name, sandboxId) => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(200).end();
    });

    const error = await rejectionOf(
      clientOf(hostile.url).deleteSandbox({ sandboxId, generation: 1, deleteTimeoutMs: 5_000 }),
    );

    expect(error).toBeInstanceOf(InvalidMessageError);
    expect(error).toMatchObject({ code: ErrorCode.MESSAGE_INVALID, retryable: false });
    expect(hostile.targets).toEqual([]);
  });
});

describe('odd replies get a defined outcome (contract v1.1 §3)', () => {
  const request = (url: string) =>
    clientOf(url).deleteSandbox({ sandboxId: 'sbx', generation: 1, deleteTimeoutMs: 5_000 });

  it.each([
    [
      'a problem report (RFC 9457)',
      'application/problem+json',
      '{"type":"about:blank","title":"Deleted"}',
      'problem report',
    ],
    ['ok: false', 'application/json', '{"ok":false}', 'body reports a failure (ok: false)'],
    [
      'success: false',
      'application/json',
      '{"success":false,"message":"quota exceeded"}',
      'body reports a failure (success: false): "quota exceeded"',
    ],
    [
      'an error',
      'application/json',
      '{"error":{"code":"E_BUSY","message":"still running"}}',
      'body reports a failure (error is set)',
    ],
  ])(
    'refuses a 200 carrying %s: PROVISIONER_UNCONFIRMED, dead-lettered with the reason',
    async (_name, contentType, body, refusal) => {
      const hostile = await startHostileServer((_request, response) => {
        response.writeHead(200, { 'content-type': contentType }).end(body);
      });

      const error = await rejectionOf(request(hostile.url));

      expect(error).toBeInstanceOf(ProvisionerUnconfirmedError);
      expect(error).toMatchObject({ retryable: false });
      expect((error as ProvisionerUnconfirmedError).details.refusal).toContain(refusal);
    },
  );

  it.each([
    ['ok: true', '{"ok":true}'],
    ['error: null', '{"error":null,"deleted":true}'],
  ])('still confirms a 200 whose body says %s', async (_name, body) => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'application/json' }).end(body);
    });
    expect(await request(hostile.url)).toBe(ReleaseOutcome.DELETED);
  });

  it.each([
    [403, ProvisionerRejectedError, false],
    [422, ProvisionerRejectedError, false],
    [503, ProvisionerUnavailableError, true],
  ])(
    'decides a %i problem report by its status, and puts its title and detail in the reason',
    async (status, type, retryable) => {
      const hostile = await startHostileServer((_request, response) => {
        response.writeHead(status, { 'content-type': 'application/problem+json' }).end(
          JSON.stringify({
            type: 'https://errors.example/quota',
            title: 'Quota exceeded',
            detail: 'tenant\nover limit',
          }),
        );
      });

      const error = (await rejectionOf(request(hostile.url))) as InstanceType<typeof type>;

      expect(error).toBeInstanceOf(type);
      expect(error.retryable).toBe(retryable);
      expect(error.message).toContain(`${status}`);
      expect(error.message).toContain('"Quota exceeded — tenant over limit"');
      expect(error.details.problem).toBe('"Quota exceeded — tenant over limit"');
    },
  );

  it('bounds the explanation of a huge problem report, and ignores one past the body limit', async () => {
    const hostile = await startHostileServer((httpRequest, response) => {
      const detail = httpRequest.url?.includes('huge')
        ? 'y'.repeat(MAX_RESPONSE_BODY_BYTES * 2)
        : 'x'.repeat(10_000);
      response
        .writeHead(403, { 'content-type': 'application/problem+json' })
        .end(JSON.stringify({ title: 'No', detail }));
    });

    const long = (await rejectionOf(request(hostile.url))) as ProvisionerRejectedError;
    expect(long.code).toBe(ErrorCode.PROVISIONER_REJECTED);
    expect(String(long.details.problem).length).toBeLessThan(220);

    const huge = (await rejectionOf(
      clientOf(hostile.url).deleteSandbox({ sandboxId: 'huge', generation: 1, deleteTimeoutMs: 5_000 }),
    )) as ProvisionerRejectedError;
    expect(huge.code).toBe(ErrorCode.PROVISIONER_REJECTED);
    expect(huge.details.problem).toBeUndefined();
  });

  it('retries a 202 (accepted, not done yet), never a confirmation, and says the delete may still act', async () => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(202, { 'content-type': 'application/json' }).end('{"status":"deleting"}');
    });
    const error = await rejectionOf(request(hostile.url));
    expect(error).toBeInstanceOf(ProvisionerUnavailableError);
    expect(error).toMatchObject({ retryable: true, deleteMayStillAct: true, details: { status: 202 } });
  });

  it.each([201, 206, 302])('refuses a %i as a bad response, not a confirmation', async (status) => {
    const hostile = await startHostileServer((_request, response) => {
      response.writeHead(status, { 'content-type': 'application/json', location: '/elsewhere' }).end('{}');
    });
    const error = await rejectionOf(request(hostile.url));
    expect(error).toBeInstanceOf(ProvisionerBadResponseError);
    expect(error).toMatchObject({ retryable: false, details: { status } });
  });

  // Replies node:http refuses to send: written byte by byte on a raw TCP socket.
  const rawServers: Array<{ close(): void }> = [];
  afterEach(() => {
    for (const server of rawServers.splice(0)) server.close();
  });
  async function rawServer(reply: string, then: 'keep' | 'close' = 'keep'): Promise<string> {
    const sockets = new Set<Socket>();
    const server = createTcpServer((socket) => {
      sockets.add(socket);
      socket.once('data', () => {
        socket.write(reply);
        if (then === 'close') setTimeout(() => socket.end(), 50);
      });
      socket.on('error', () => {});
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    rawServers.push({
      close: () => {
        for (const socket of sockets) socket.destroy();
        server.close();
      },
    });
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  it.each([600, 999])(
    'refuses status %i, outside HTTP’s range, as a bad response (dead letter)',
    async (status) => {
      const url = await rawServer(`HTTP/1.1 ${status} Odd\r\ncontent-length: 0\r\n\r\n`);
      const error = await rejectionOf(request(url));
      expect(error).toBeInstanceOf(ProvisionerBadResponseError);
      expect(error).toMatchObject({ retryable: false, details: { status } });
      expect((error as Error).message).toContain("outside HTTP's range");
    },
  );

  it.each([
    ['a four-digit status', 'HTTP/1.1 1000 Odd\r\ncontent-length: 0\r\n\r\n'],
    ['a status below 100', 'HTTP/1.1 099 Odd\r\ncontent-length: 0\r\n\r\n'],
    [
      'a 100 Continue nobody asked for',
      'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n',
    ],
    ['a line that is not HTTP at all', 'SSH-2.0-OpenSSH_9.6\r\n'],
  ])(
    'refuses %s as not HTTP/1.1: a bad response naming the URL, not an internal error',
    async (_name, reply) => {
      const url = await rawServer(reply);
      const error = await rejectionOf(request(url));
      expect(error).toBeInstanceOf(ProvisionerBadResponseError);
      expect(error).toMatchObject({ retryable: false });
      expect((error as Error).message).toMatch(/not valid HTTP\/1\.1 .*SANDBOX_PROVISIONER_URL/);
    },
  );

  it('retries an informational answer followed by a closed connection (retryable, no confirmation)', async () => {
    const url = await rawServer('HTTP/1.1 199 Odd\r\n\r\n', 'close');
    const error = await rejectionOf(request(url));
    expect(error).toBeInstanceOf(ProvisionerConnectionError);
    expect(error).toMatchObject({ retryable: true });
  });

  it('skips a 103 Early Hints and takes the final answer', async () => {
    const url = await rawServer(
      'HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n',
    );
    expect(await request(url)).toBe(ReleaseOutcome.DELETED);
  });
});
