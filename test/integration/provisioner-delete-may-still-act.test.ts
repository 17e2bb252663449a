/**
 * After a failed DELETE, may the provisioner still carry it out? The one delete path
 * (guarded-delete.ts) keeps a scope quarantined exactly while this is true, for release and the
 * reclaimer alike, and reads it from one place: the failure itself, as the provisioner client and
 * the provider's keyed lock decided it (`CleanupError.deleteMayStillAct`). A wrong "no" reopens a
 * scope under a DELETE that can still land; a wrong "yes" only keeps it closed longer. Real HTTP
 * servers answering exactly the bytes under test.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { CleanupError, deleteMayStillAct, ReleaseLockTimeoutError } from '../../functions/cleanup/errors.ts';
import { release } from '../../functions/cleanup/release.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';

const servers: Server[] = [];
const clients: ProvisionerClient[] = [];

afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.close()));
  await Promise.all(
    servers.splice(0).map((server) => new Promise<void>((resolve) => server.close(() => resolve()))),
  );
});

type Handler = (
  request: import('node:http').IncomingMessage,
  response: import('node:http').ServerResponse,
) => void;

async function serving(handler: Handler): Promise<string> {
  const server = createServer(handler);
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

const answering = (status: number, body = '', type = 'application/json') =>
  serving((_request, response) => {
    response.writeHead(status, body ? { 'content-type': type } : {});
    response.end(body);
  });

async function failureAt(baseUrl: string, deleteTimeoutMs = 5_000): Promise<CleanupError> {
  const client = new ProvisionerClient(baseUrl);
  clients.push(client);
  const outcome = await client
    .deleteSandbox({ sandboxId: 'sbx-1', generation: 3, deleteTimeoutMs })
    .catch((error: unknown) => error);
  expect(outcome).toBeInstanceOf(CleanupError);
  return outcome as CleanupError;
}

describe('the provisioner answered and decided: nothing of the DELETE acts any more', () => {
  it.each([
    ['a 4xx rejection', () => answering(403, '{"error":"forbidden"}')],
    ['a 409 naming an older generation', () => answering(409, '{"current_generation": 1}')],
    ['a 409 naming the generation being deleted', () => answering(409, '{"current_generation": 3}')],
    ['a 429', () => answering(429)],
    ['a 200 that is an HTML page', () => answering(200, '<html></html>', 'text/html')],
    ['a 200 that reports a failure', () => answering(200, '{"deleted": false}')],
    ['a 200 whose status is the number 500', () => answering(200, '{"status": 500}')],
    ['a 200 wrapping a failure in data', () => answering(200, '{"data":{"status":"failed"}}')],
    ['a 200 whose state is "failed"', () => answering(200, '{"state":"failed"}')],
    ['a 200 whose phase is "Failed"', () => answering(200, '{"phase":"Failed"}')],
    ['a 200 with a failure code and message', () => answering(200, '{"code":1,"message":"sandbox busy"}')],
    [
      'a 200 whose envelope names another sandbox',
      () => answering(200, '{"data":{"sandbox_id":"other","status":"deleted"}}'),
    ],
    ['a 404 page from a web server', () => answering(404, '<h1>Not Found</h1>', 'text/html')],
    ['a redirect', () => answering(302)],
  ])('%s', async (_name, start) => {
    expect((await failureAt(await start())).deleteMayStillAct).toBe(false);
  });

  it('a connection that was never made (nothing listening)', async () => {
    const url = await answering(200, '{}');
    await new Promise<void>((resolve) => servers.pop()!.close(() => resolve()));
    const error = await failureAt(url);
    expect(error.details.errorCode).toBe('ECONNREFUSED');
    expect(error.deleteMayStillAct).toBe(false);
  });
});

describe('the DELETE may still be carried out', () => {
  it.each([
    ['a 202 (accepted, not done yet)', () => answering(202, '{"status":"deleting"}')],
    ['a 200 whose body says the delete is still in progress', () => answering(200, '{"status":"deleting"}')],
    // Said in other words than one list could hold: only a "done" word confirms.
    [
      'a 200 "DELETE_IN_PROGRESS"',
      () => answering(200, '{"sandbox_id":"sbx-1","status":"DELETE_IN_PROGRESS"}'),
    ],
    ['a 200 "terminating"', () => answering(200, '{"sandbox_id":"sbx-1","status":"terminating"}')],
    ['a 200 "running"', () => answering(200, '{"sandbox_id":"sbx-1","status":"running"}')],
    ['a 200 whose state is "deleting"', () => answering(200, '{"sandbox_id":"sbx-1","state":"deleting"}')],
    ['a 200 whose phase is "Terminating"', () => answering(200, '{"phase":"Terminating"}')],
    [
      'a 200 whose message says so',
      () => answering(200, '{"sandbox_id":"sbx-1","message":"deletion in progress"}'),
    ],
    // Not a done word: a number, a flag, a wrapped answer. Only a done word confirms.
    ['a 200 whose status is the number 202', () => answering(200, '{"sandbox_id":"sbx-1","status":202}')],
    ['a 200 whose status is true', () => answering(200, '{"status":true}')],
    ['a 200 whose status is an object', () => answering(200, '{"status":{"phase":"Terminating"}}')],
    ['a 200 wrapping "deleting" in data', () => answering(200, '{"data":{"status":"deleting"}}')],
    [
      'a 200 whose result is "scheduled for deletion"',
      () => answering(200, '{"result":"scheduled for deletion"}'),
    ],
    ['a 200 that says accepted', () => answering(200, '{"accepted":true}')],
    // Shapes of real APIs: JSON:API, Go structs, a long-running operation, a Kubernetes object.
    [
      'a 200 JSON:API resource whose attributes say "deleting"',
      () => answering(200, '{"data":{"type":"sandboxes","id":"sbx-1","attributes":{"status":"deleting"}}}'),
    ],
    ['a 200 Go struct "Status"', () => answering(200, '{"ID":"sbx-1","Status":"DELETE_IN_PROGRESS"}')],
    ['a 200 operation not done', () => answering(200, '{"name":"operations/del-1","done":false}')],
    [
      'a 200 Kubernetes object with finalizers pending',
      () => answering(200, '{"metadata":{"deletionTimestamp":"2026-12-05T08:00:00Z","finalizers":["x"]}}'),
    ],
    [
      'a 200 whose message says it is being deleted',
      () => answering(200, '{"message":"Sandbox is being deleted"}'),
    ],
    ['a 503 (a gateway whose upstream may still work)', () => answering(503)],
    ['a 504', () => answering(504)],
    ['a status outside HTTP', () => answering(600)],
  ])('%s', async (_name, start) => {
    expect((await failureAt(await start())).deleteMayStillAct).toBe(true);
  });

  it('no answer within the delete timeout', async () => {
    const url = await serving(() => {}); // reads the request, never answers
    const error = await failureAt(url, 300);
    expect(error.code).toBe('PROVISIONER_DELETE_TIMEOUT');
    expect(error.deleteMayStillAct).toBe(true);
  });

  it('a reset after the request was written, even when the immediate retry is answered with a 4xx', async () => {
    let requests = 0;
    const url = await serving((request, response) => {
      requests += 1;
      if (requests === 1) {
        request.socket.destroy();
        return;
      }
      response.writeHead(400, { 'content-type': 'application/json' }).end('{"error":"bad"}');
    });
    const error = await failureAt(url);
    expect(requests).toBe(2);
    expect(error.code).toBe('PROVISIONER_REJECTED');
    expect(error.deleteMayStillAct).toBe(true);
  });

  it('the whole release deadline aborting a DELETE on the wire', async () => {
    const url = await serving(() => {});
    const client = new ProvisionerClient(url);
    clients.push(client);
    const provider = new SandboxProvider({
      client,
      releaseLockTimeoutMs: 1_000,
      provisionerDeleteTimeoutMs: 5_000,
    });
    const outcome = await release(
      {
        runId: 'r',
        uid: 'u',
        runtimeScopeId: 's',
        sandboxId: 'sbx-1',
        generation: 3,
        workdirPath: 'w',
        fenceSetAt: null,
      },
      { provider, runtimeCleanupTimeoutMs: 300 },
    ).catch((error: unknown) => error);
    expect((outcome as CleanupError).code).toBe('CLEANUP_TIMEOUT');
    expect(deleteMayStillAct(outcome)).toBe(true);
  });

  it('a failure nobody classified', () => {
    expect(deleteMayStillAct(new TypeError('a bug'))).toBe(true);
  });
});

describe('the DELETE was never sent', () => {
  async function providerWithHeldLock() {
    const url = await answering(200, '{}');
    const client = new ProvisionerClient(url);
    clients.push(client);
    const provider = new SandboxProvider({
      client,
      releaseLockTimeoutMs: 200,
      provisionerDeleteTimeoutMs: 5_000,
    });
    const unlock = await provider.lock.acquire(SandboxProvider.lockKey({ uid: 'u', runtimeScopeId: 's' }), {
      timeoutMs: 1_000,
      onTimeout: () => new Error('unexpected'),
    });
    return { provider, unlock };
  }
  const identity = {
    runId: 'r',
    uid: 'u',
    runtimeScopeId: 's',
    sandboxId: 'sbx-1',
    generation: 3,
    workdirPath: 'w',
    fenceSetAt: null,
  };

  it('the keyed lock was not had in time', async () => {
    const { provider, unlock } = await providerWithHeldLock();
    const outcome = await release(identity, { provider, runtimeCleanupTimeoutMs: 5_000 }).catch(
      (e: unknown) => e,
    );
    unlock();
    expect(outcome).toBeInstanceOf(ReleaseLockTimeoutError);
    expect(deleteMayStillAct(outcome)).toBe(false);
  });

  it('the whole release deadline ended the wait for the keyed lock', async () => {
    const { provider, unlock } = await providerWithHeldLock();
    const outcome = await release(identity, { provider, runtimeCleanupTimeoutMs: 100 }).catch(
      (e: unknown) => e,
    );
    unlock();
    expect((outcome as CleanupError).code).toBe('CLEANUP_TIMEOUT');
    expect(deleteMayStillAct(outcome)).toBe(false);
  });
});
