/**
 * The provisioner client against real HTTP servers: the local provisioner (real sandboxes, and
 * faults for the misbehaviours it can produce) and, for replies no honest provisioner sends, a
 * tiny hostile node:http server written here. Each contract reply maps to one outcome or one
 * error class with a stable code and the right `retryable`.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
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
  ProvisionerUnavailableError,
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

  it.each([500, 502, 503, 504])('maps %i to a retryable ProvisionerUnavailableError', async (status) => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { status });

    const error = await rejectionOf(remove(sandboxId, generation));

    expect(error).toBeInstanceOf(ProvisionerUnavailableError);
    expect(error).toMatchObject({
      code: ErrorCode.PROVISIONER_UNAVAILABLE,
      retryable: true,
      details: { status },
    });
  });

  it.each([400, 401, 403, 405, 410, 422])(
    'maps %i to a non-retryable ProvisionerRejectedError',
    async (status) => {
      const { sandboxId, generation } = await liveSandbox();
      fixture.provisioner.setFault(sandboxId, { status });

      const error = await rejectionOf(remove(sandboxId, generation));

      expect(error).toBeInstanceOf(ProvisionerRejectedError);
      expect(error).toMatchObject({
        code: ErrorCode.PROVISIONER_REJECTED,
        retryable: false,
        details: { status },
      });
    },
  );

  it.each([202, 301, 302, 307])(
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

describe('bodies of successful replies', () => {
  it('accepts a 200 with a 20 MB body as DELETED', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { oversizedBodyBytes: 20 * 1024 * 1024 });

    expect(await remove(sandboxId, generation)).toBe(ReleaseOutcome.DELETED);
  });

  it('does not buffer a 200 body: one that never ends still yields DELETED well inside the delete timeout', async () => {
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

    const outcome = await clientOf(hostile.url).deleteSandbox({
      sandboxId: 'sbx',
      generation: 1,
      deleteTimeoutMs: 10_000,
    });

    expect(outcome).toBe(ReleaseOutcome.DELETED);
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

  it('counts a 200 as DELETED even when its body drips in past the delete timeout: the status alone confirms', async () => {
    const { sandboxId, generation } = await liveSandbox();
    fixture.provisioner.setFault(sandboxId, { slowBodyMs: 3_000 });

    expect(await remove(sandboxId, generation, { deleteTimeoutMs: 300 })).toBe(ReleaseOutcome.DELETED);
    expect(fixture.provisioner.sandbox(sandboxId)).toBeUndefined();
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
      response.writeHead(404).end();
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
      response.writeHead(200).end();
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
    ['over 512 characters', 'x'.repeat(513)],
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
