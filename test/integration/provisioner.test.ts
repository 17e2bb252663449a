import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { access, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Client, request } from 'undici';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  type AuditEntry,
  isProcessAlive,
  type LocalProvisioner,
  startProvisioner,
} from '../../infra/local/provisioner/server.ts';

const REPO_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

let rootDir: string;
let provisioner: LocalProvisioner;
const extraProvisioners: LocalProvisioner[] = [];

beforeEach(async () => {
  rootDir = await mkdtemp(join(tmpdir(), 'provisioner-test-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 1000, seed: 42 });
});

afterEach(async () => {
  await Promise.all([provisioner.stop(), ...extraProvisioners.splice(0).map((other) => other.stop())]);
  await rm(rootDir, { recursive: true, force: true });
});

// --- Prepare: a small client for the API ---------------------------------------------------

interface Reply {
  readonly status: number;
  readonly body: Record<string, unknown>;
  readonly text: string;
}

async function call(
  method: 'GET' | 'POST' | 'DELETE' | 'PUT',
  path: string,
  options: { body?: unknown; signal?: AbortSignal; base?: LocalProvisioner } = {},
): Promise<Reply> {
  const base = options.base ?? provisioner;
  const response = await request(`${base.url}${path}`, {
    method,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    headers: options.body === undefined ? {} : { 'content-type': 'application/json' },
    signal: options.signal,
  });
  const text = await response.body.text();
  let body: Record<string, unknown> = {};
  try {
    body = JSON.parse(text) as Record<string, unknown>;
  } catch {}
  return { status: response.statusCode, body, text };
}

function createSandbox(sandboxId: string, base?: LocalProvisioner): Promise<Reply> {
  return call('POST', '/api/sandboxes', {
    body: { sandbox_id: sandboxId, thread_id: 't', user_id: 'u' },
    base,
  });
}

/**
 * Dots are encoded too: otherwise the ids `.` and `..` would be dot segments, and a WHATWG URL
 * parser (undici's `request`, fetch) would resolve them away before the request is sent.
 */
function sandboxPath(sandboxId: string, generation?: number | string): string {
  const query = generation === undefined ? '' : `?generation=${generation}`;
  return `/api/sandboxes/${encodeURIComponent(sandboxId).replaceAll('.', '%2E')}${query}`;
}

/**
 * A request through a bare `Client`, which sends the path exactly as given. WHATWG URL parsing
 * treats even `%2E%2E` as a dot segment, so `request()` cannot address the id `..` at all.
 */
async function rawCall(method: 'GET' | 'DELETE', path: string): Promise<Reply> {
  const client = new Client(provisioner.url);
  try {
    const response = await client.request({ method, path });
    const text = await response.body.text();
    return { status: response.statusCode, body: JSON.parse(text) as Record<string, unknown>, text };
  } finally {
    await client.close();
  }
}

function deleteSandbox(
  sandboxId: string,
  generation?: number | string,
  signal?: AbortSignal,
): Promise<Reply> {
  return call('DELETE', sandboxPath(sandboxId, generation), { signal });
}

async function exists(path: string): Promise<boolean> {
  return access(path).then(
    () => true,
    () => false,
  );
}

/** Polls until `condition` holds; process exit has no event to await from outside. */
async function eventually(condition: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

function liveSandbox(sandboxId: string) {
  const sandbox = provisioner.sandbox(sandboxId);
  if (!sandbox) throw new Error(`sandbox ${sandboxId} is not live`);
  return sandbox;
}

function isDeleteOf(sandboxId: string) {
  return (entry: AuditEntry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId;
}

// --- Sandbox lifecycle -----------------------------------------------------------------------

describe('sandbox lifecycle', () => {
  it('creates a sandbox as a real process running in its own directory under the root', async () => {
    const created = await createSandbox('run-1');

    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ sandbox_id: 'run-1', status: 'running', generation: 1 });
    expect(created.body.sandbox_url).toBe(`${provisioner.url}/sandboxes/run-1`);
    const sandbox = liveSandbox('run-1');
    expect(sandbox.alive).toBe(true);
    expect(isProcessAlive(sandbox.pid)).toBe(true);
    expect(dirname(sandbox.dir)).toBe(provisioner.rootDir);
    const marker = JSON.parse(await readFile(join(sandbox.dir, 'sandbox.json'), 'utf8')) as unknown;
    expect(marker).toMatchObject({ sandboxId: 'run-1', generation: 1 });
  });

  it('GET returns a live sandbox and 404 for an id that was never created', async () => {
    await createSandbox('run-1');

    const found = await call('GET', sandboxPath('run-1'));
    const missing = await call('GET', sandboxPath('never'));

    expect(found.status).toBe(200);
    expect(found.body).toMatchObject({ sandbox_id: 'run-1', status: 'running', generation: 1 });
    expect(missing).toMatchObject({ status: 404, body: { error: 'not found' } });
  });

  it('POST for a live id returns the same sandbox with 200 and starts nothing new', async () => {
    await createSandbox('run-1');
    const before = liveSandbox('run-1');

    const again = await createSandbox('run-1');

    expect(again.status).toBe(200);
    expect(again.body.generation).toBe(1);
    expect(liveSandbox('run-1').pid).toBe(before.pid);
    expect(provisioner.liveSandboxes()).toHaveLength(1);
  });

  it('deleting the live generation kills the process and removes its directory; deleting again is 404', async () => {
    await createSandbox('run-1');
    const { pid, dir } = liveSandbox('run-1');

    const deleted = await deleteSandbox('run-1', 1);

    expect(deleted).toMatchObject({ status: 200, body: { deleted: true, generation: 1 } });
    expect(isProcessAlive(pid)).toBe(false);
    expect(await exists(dir)).toBe(false);
    expect(provisioner.sandbox('run-1')).toBeUndefined();
    expect((await deleteSandbox('run-1', 1)).status).toBe(404);
    expect((await call('GET', sandboxPath('run-1'))).status).toBe(404);
  });

  it('re-creating an id starts generation 2, and a DELETE of generation 1 is 409 and leaves it running', async () => {
    await createSandbox('run-1');
    await deleteSandbox('run-1', 1);

    const recreated = await createSandbox('run-1');
    const stale = await deleteSandbox('run-1', 1);

    expect(recreated).toMatchObject({ status: 201, body: { generation: 2 } });
    expect(stale).toMatchObject({ status: 409, body: { current_generation: 2 } });
    const sandbox = liveSandbox('run-1');
    expect(sandbox.generation).toBe(2);
    expect(isProcessAlive(sandbox.pid)).toBe(true);
    expect(await exists(sandbox.dir)).toBe(true);
  });

  it('a DELETE without generation deletes whatever generation is live (the old client)', async () => {
    await createSandbox('run-1');
    await deleteSandbox('run-1', 1);
    await createSandbox('run-1');
    const { pid } = liveSandbox('run-1');

    const deleted = await deleteSandbox('run-1');

    expect(deleted).toMatchObject({ status: 200, body: { deleted: true, generation: 2 } });
    expect(isProcessAlive(pid)).toBe(false);
  });

  it('rejects malformed requests with 400, unknown routes with 404 and wrong methods with 405', async () => {
    await createSandbox('run-1');

    const results = await Promise.all([
      call('POST', '/api/sandboxes', { body: { sandbox_id: '', thread_id: 't', user_id: 'u' } }),
      call('POST', '/api/sandboxes', { body: { sandbox_id: 'x', thread_id: 't' } }),
      call('POST', '/api/sandboxes', { body: 'not an object' }),
      deleteSandbox('run-1', -1),
      deleteSandbox('run-1', 'abc'),
      deleteSandbox('run-1', 1.5),
      deleteSandbox('run-1', ''),
      call('GET', '/api/sandboxes/%E0%A4%A'),
      call('GET', '/api/unknown'),
      call('GET', '/api/sandboxes/a/b'),
      call('PUT', sandboxPath('run-1')),
      call('PUT', '/api/sandboxes'),
    ]);

    expect(results.map((result) => result.status)).toEqual([
      400, 400, 400, 400, 400, 400, 400, 400, 404, 404, 405, 405,
    ]);
    expect(results[0]?.body.error).toEqual(expect.any(String));
    expect(liveSandbox('run-1').alive).toBe(true);
  });

  it('keeps the work directory of ids such as ../../etc inside the root', async () => {
    const hostileIds = ['../../etc', '..', '/absolute/path', 'a/b', 'a?b#c', '%2F..%2F', ' ', 'ünïcødé 🙂'];

    for (const sandboxId of hostileIds) {
      const created = await createSandbox(sandboxId);
      expect(created.status).toBe(201);
      const sandbox = liveSandbox(sandboxId);
      expect(dirname(sandbox.dir)).toBe(provisioner.rootDir);
      expect(relative(provisioner.rootDir, sandbox.dir).startsWith('..')).toBe(false);
      expect((await rawCall('GET', sandboxPath(sandboxId))).body.sandbox_id).toBe(sandboxId);
    }
    const dirs = new Set(provisioner.liveSandboxes().map((sandbox) => sandbox.dir));
    expect(dirs.size).toBe(hostileIds.length);
    for (const sandboxId of hostileIds) {
      expect((await rawCall('DELETE', sandboxPath(sandboxId, 1))).status).toBe(200);
    }
    expect(provisioner.liveSandboxes()).toEqual([]);
  });

  it('kills a sandbox that ignores SIGTERM with SIGKILL after the grace period', async () => {
    const stubbornRoot = join(rootDir, 'stubborn');
    const stubborn = await startProvisioner({
      rootDir: stubbornRoot,
      graceMs: 200,
      sandboxIgnoresSigterm: true,
    });
    extraProvisioners.push(stubborn);
    await createSandbox('run-1', stubborn);
    const sandbox = stubborn.sandbox('run-1')!;
    // Until its SIGTERM handler is installed (it then writes `ready`), SIGTERM would kill it outright.
    await eventually(() => existsSync(join(sandbox.dir, 'ready')), 'the sandbox to install its handler');

    const started = performance.now();
    const deleted = await call('DELETE', sandboxPath('run-1', 1), { base: stubborn });

    expect(deleted.status).toBe(200);
    expect(performance.now() - started).toBeGreaterThanOrEqual(150);
    expect(isProcessAlive(sandbox.pid)).toBe(false);
  });
});

// --- Concurrency -------------------------------------------------------------------------------

describe('listing: GET /api/sandboxes (contract §3)', () => {
  it('lists every live sandbox with its generation, and the count', async () => {
    await createSandbox('run-a');
    await createSandbox('run-b');
    await deleteSandbox('run-b', 1);
    await createSandbox('run-b');

    const listed = await call('GET', '/api/sandboxes');

    expect(listed.status).toBe(200);
    expect(listed.body.count).toBe(2);
    expect(listed.body.sandboxes).toEqual(
      expect.arrayContaining([
        {
          sandbox_id: 'run-a',
          sandbox_url: `${provisioner.url}/sandboxes/run-a`,
          status: 'running',
          generation: 1,
        },
        {
          sandbox_id: 'run-b',
          sandbox_url: `${provisioner.url}/sandboxes/run-b`,
          status: 'running',
          generation: 2,
        },
      ]),
    );
  });

  it('lists nothing once every sandbox is deleted', async () => {
    await createSandbox('run-a');
    await deleteSandbox('run-a', 1);
    expect(await call('GET', '/api/sandboxes')).toMatchObject({
      status: 200,
      body: { sandboxes: [], count: 0 },
    });
  });
});

/**
 * The platform's provisioner as deployed today: POST reuses a live sandbox, DELETE ignores the
 * generation (and answers 200 even when there is nothing), the list carries no generation. The
 * release guard's safety is proven against this mode, not only against the generation guard.
 */
describe('platform-compatible mode', () => {
  let platform: LocalProvisioner;
  beforeEach(async () => {
    platform = await startProvisioner({ rootDir: join(rootDir, 'platform'), graceMs: 500, mode: 'platform' });
    extraProvisioners.push(platform);
  });

  it('reuses a live sandbox on POST: same process, same generation', async () => {
    const first = await createSandbox('run-1', platform);
    const { pid } = platform.sandbox('run-1')!;

    const again = await createSandbox('run-1', platform);

    expect(first.status).toBe(201);
    expect(again).toMatchObject({ status: 200, body: { sandbox_id: 'run-1', generation: 1 } });
    expect(platform.sandbox('run-1')!.pid).toBe(pid);
    expect(platform.liveSandboxes()).toHaveLength(1);
  });

  it('deletes whatever is live whatever generation the DELETE names, answering 200 {ok, sandbox_id}', async () => {
    await createSandbox('run-1', platform);
    const { pid } = platform.sandbox('run-1')!;

    const deleted = await call('DELETE', sandboxPath('run-1', 99), { base: platform });

    expect(deleted).toMatchObject({ status: 200, body: { ok: true, sandbox_id: 'run-1' } });
    expect(isProcessAlive(pid)).toBe(false);
    expect(platform.sandbox('run-1')).toBeUndefined();
    expect(platform.audit().filter(isDeleteOf('run-1'))).toEqual([
      expect.objectContaining({ generation: 99, deletedGeneration: 1, status: 200 }),
    ]);
  });

  it('answers 200 to a DELETE of a sandbox that does not exist, deleting nothing', async () => {
    const answer = await call('DELETE', sandboxPath('never', 1), { base: platform });
    expect(answer).toMatchObject({ status: 200, body: { ok: true, sandbox_id: 'never' } });
    expect(platform.audit().filter(isDeleteOf('never'))[0]!.deletedGeneration).toBeUndefined();
  });

  it('lists live sandboxes without a generation', async () => {
    await createSandbox('run-1', platform);
    const listed = await call('GET', '/api/sandboxes', { base: platform });
    expect(listed.body).toEqual({
      sandboxes: [{ sandbox_id: 'run-1', sandbox_url: `${platform.url}/sandboxes/run-1`, status: 'running' }],
      count: 1,
    });
  });

  it('is the contract mode unless asked, and refuses an unknown mode', async () => {
    expect(provisioner.mode).toBe('contract');
    expect(platform.mode).toBe('platform');
    await expect(startProvisioner({ rootDir, mode: 'yuxi' as unknown as 'platform' })).rejects.toThrow(
      /mode/,
    );
  });
});

describe('concurrent deletes', () => {
  it('delete a sandbox exactly once: one 200, the others 404, never a 500', async () => {
    await createSandbox('run-1');
    const { pid } = liveSandbox('run-1');

    const results = await Promise.all([
      deleteSandbox('run-1', 1),
      deleteSandbox('run-1', 1),
      deleteSandbox('run-1'),
      deleteSandbox('run-1', 1),
      deleteSandbox('run-1'),
    ]);

    const statuses = results.map((result) => result.status).sort();
    expect(statuses).toEqual([200, 404, 404, 404, 404]);
    expect(isProcessAlive(pid)).toBe(false);
    const deletions = provisioner.audit().filter((entry) => entry.deletedGeneration !== undefined);
    expect(deletions).toHaveLength(1);
  });

  it('a create racing a delete of the same id yields the next generation, never two live processes', async () => {
    await createSandbox('run-1');
    const first = liveSandbox('run-1');

    const [deleted, created] = await Promise.all([deleteSandbox('run-1', 1), createSandbox('run-1')]);

    expect(deleted.status).toBe(200);
    expect(created.status).toBe(201);
    expect(created.body.generation).toBe(2);
    expect(isProcessAlive(first.pid)).toBe(false);
    expect(liveSandbox('run-1').generation).toBe(2);
  });
});

// --- Faults --------------------------------------------------------------------------------------

describe('faults', () => {
  it('latencyMs delays the answer, then handles the request normally', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { latencyMs: 300 });

    const started = performance.now();
    const deleted = await deleteSandbox('run-1', 1);

    expect(deleted.status).toBe(200);
    expect(performance.now() - started).toBeGreaterThanOrEqual(250);
    expect(provisioner.audit().at(-1)).toMatchObject({ fault: 'latency', deletedGeneration: 1 });
  });

  it('hang holds a DELETE until the client aborts; the sandbox is untouched and nothing stays in flight', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { hang: true });
    const abort = new AbortController();

    const pending = deleteSandbox('run-1', 1, abort.signal);
    const arrived = await provisioner.waitForRequest(isDeleteOf('run-1'), 5000);
    expect(arrived).toMatchObject({ outcome: 'pending', generation: 1 });
    expect(provisioner.inFlight()).toBe(1);
    abort.abort();

    await expect(pending).rejects.toThrow();
    await eventually(() => provisioner.inFlight() === 0, 'the aborted request to leave');
    const entry = provisioner.audit().find((candidate) => candidate.seq === arrived.seq);
    expect(entry).toMatchObject({ outcome: 'aborted', fault: 'hang' });
    expect(entry?.status).toBeUndefined();
    expect(entry?.deletedGeneration).toBeUndefined();
    expect(liveSandbox('run-1').alive).toBe(true);
  });

  it('a client giving up during latency leaves the sandbox untouched', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { latencyMs: 2000 });
    const abort = new AbortController();

    const pending = deleteSandbox('run-1', 1, abort.signal);
    await provisioner.waitForRequest(isDeleteOf('run-1'), 5000);
    abort.abort();

    await expect(pending).rejects.toThrow();
    await eventually(() => provisioner.inFlight() === 0, 'the aborted request to leave');
    expect(provisioner.audit().at(-1)?.outcome).toBe('aborted');
    expect(liveSandbox('run-1').alive).toBe(true);
  });

  it('clearing a hang fault releases the hung request, which is then handled normally', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { hang: true });

    const pending = deleteSandbox('run-1', 1);
    await provisioner.waitForRequest(isDeleteOf('run-1'), 5000);
    expect(liveSandbox('run-1').alive).toBe(true);
    provisioner.clearFaults('run-1');

    expect(await pending).toMatchObject({ status: 200, body: { deleted: true, generation: 1 } });
    expect(provisioner.audit().at(-1)).toMatchObject({
      outcome: 'answered',
      fault: 'hang',
      deletedGeneration: 1,
    });
  });

  it('stop() ends a hung request: the client sees an error and the audit says hung', async () => {
    await createSandbox('run-1');
    provisioner.setFault('*', { hang: true });

    // Expect the failure before stopping, so the rejection is never momentarily unhandled.
    const failed = expect(deleteSandbox('run-1', 1)).rejects.toThrow();
    const arrived = await provisioner.waitForRequest(isDeleteOf('run-1'), 5000);
    await provisioner.stop();

    await failed;
    expect(provisioner.audit().find((entry) => entry.seq === arrived.seq)?.outcome).toBe('hung');
    expect(provisioner.inFlight()).toBe(0);
  });

  it('reset drops the connection without answering and without touching the sandbox', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { reset: true });

    await expect(deleteSandbox('run-1', 1)).rejects.toThrow();

    expect(provisioner.audit().at(-1)).toMatchObject({ outcome: 'reset', fault: 'reset' });
    expect(liveSandbox('run-1').alive).toBe(true);
  });

  it('reset with afterHandling deletes the sandbox and loses only the answer', async () => {
    await createSandbox('run-1');
    const { pid } = liveSandbox('run-1');
    provisioner.setFault('run-1', { reset: true, afterHandling: true });

    await expect(deleteSandbox('run-1', 1)).rejects.toThrow();

    expect(provisioner.audit().at(-1)).toMatchObject({ outcome: 'reset', deletedGeneration: 1 });
    expect(isProcessAlive(pid)).toBe(false);
  });

  it('status answers the injected status and body without touching the sandbox', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { status: 503, times: 1 });
    provisioner.setFault('run-1', { status: 400, body: 'plain words', times: 1 });

    const first = await deleteSandbox('run-1', 1);
    const second = await deleteSandbox('run-1', 1);

    expect(first.status).toBe(503);
    expect(first.body.error).toEqual(expect.stringContaining('503'));
    expect(second).toMatchObject({ status: 400, text: 'plain words' });
    expect(liveSandbox('run-1').alive).toBe(true);
    expect(
      provisioner
        .audit()
        .slice(-2)
        .map((entry) => entry.fault),
    ).toEqual(['status:503', 'status:400']);
  });

  it('conflictGeneration answers 409 with that generation without touching anything', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { conflictGeneration: 7 });

    const conflict = await deleteSandbox('run-1', 1);

    expect(conflict).toMatchObject({ status: 409, body: { current_generation: 7 } });
    expect(liveSandbox('run-1').generation).toBe(1);
  });

  it('oversizedBodyBytes really deletes and answers 200 with a body of that many bytes', async () => {
    await createSandbox('run-1');
    const { pid } = liveSandbox('run-1');
    provisioner.setFault('run-1', { oversizedBodyBytes: 5 * 1024 * 1024 });

    const deleted = await deleteSandbox('run-1', 1);

    expect(deleted.status).toBe(200);
    expect(Buffer.byteLength(deleted.text)).toBe(5 * 1024 * 1024);
    expect(deleted.body).toMatchObject({ deleted: true, generation: 1 });
    expect(isProcessAlive(pid)).toBe(false);
  });

  it('slowBodyMs sends the headers first and drips the body over the given time', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { slowBodyMs: 400 });

    const response = await request(`${provisioner.url}${sandboxPath('run-1', 1)}`, { method: 'DELETE' });
    const headersAt = performance.now();
    const body = await response.body.json();
    const bodyMs = performance.now() - headersAt;

    expect(response.statusCode).toBe(200);
    expect(body).toEqual({ deleted: true, generation: 1 });
    expect(bodyMs).toBeGreaterThanOrEqual(200);
  });

  it('a fault with times applies to that many matching requests, then expires', async () => {
    provisioner.setFault('run-1', { status: 503, times: 2 });

    const statuses = [];
    for (let attempt = 0; attempt < 3; attempt += 1) statuses.push((await deleteSandbox('run-1', 1)).status);

    expect(statuses).toEqual([503, 503, 404]);
  });

  it('applies to DELETE only unless a method is given, and a sandbox fault comes before the * fault', async () => {
    await createSandbox('run-1');
    provisioner.setFault('*', { status: 500 });
    provisioner.setFault('run-1', { conflictGeneration: 9 });
    provisioner.setFault('*', { status: 502, method: 'GET' });

    expect((await call('GET', sandboxPath('run-1'))).status).toBe(502);
    expect((await createSandbox('run-2')).status).toBe(201);
    expect((await deleteSandbox('run-1', 1)).status).toBe(409);
    expect((await deleteSandbox('run-2', 1)).status).toBe(500);
  });

  it('a seeded probability gives the same decisions for the same seed', async () => {
    async function decisions(seed: number): Promise<number[]> {
      const seeded = await startProvisioner({ rootDir: join(rootDir, `seed-${seed}`), seed });
      extraProvisioners.push(seeded);
      seeded.setFault('*', { status: 503, probability: 0.5 });
      const statuses: number[] = [];
      for (let attempt = 0; attempt < 30; attempt += 1) {
        statuses.push((await call('DELETE', sandboxPath('missing', 1), { base: seeded })).status);
      }
      return statuses;
    }

    const first = await decisions(7);
    const replay = await decisions(7);
    const otherSeed = await decisions(8);

    expect(replay).toEqual(first);
    expect(first).toContain(503);
    expect(first).toContain(404);
    // 30 fair coin flips agree by chance with probability 2^-30.
    expect(otherSeed).not.toEqual(first);
  });

  it('a fault profile misbehaves at random and stops when removed', async () => {
    provisioner.setFaultProfile({ error: 1, errorStatus: 503 });
    const during = await deleteSandbox('missing', 1);
    provisioner.setFaultProfile(undefined);
    const after = await deleteSandbox('missing', 1);

    expect(during.status).toBe(503);
    expect(after.status).toBe(404);
    expect(provisioner.audit().map((entry) => entry.fault)).toEqual(['profile:status:503', undefined]);
  });

  it('a fault profile with slowMs alone slows every request it does not fail', async () => {
    provisioner.setFaultProfile({ slowMs: 150 });

    const started = performance.now();
    const reply = await deleteSandbox('missing', 1);

    expect(reply.status).toBe(404);
    expect(performance.now() - started).toBeGreaterThanOrEqual(100);
    expect(provisioner.audit().at(-1)?.fault).toBe('profile:latency');
  });

  it('removing a fault profile releases the requests it hung', async () => {
    provisioner.setFaultProfile({ hang: 1 });
    const pending = deleteSandbox('missing', 1);
    await provisioner.waitForRequest(isDeleteOf('missing'), 5000);

    provisioner.setFaultProfile(undefined);

    expect((await pending).status).toBe(404);
    expect(provisioner.audit().at(-1)).toMatchObject({ fault: 'profile:hang', outcome: 'answered' });
  });

  it('rejects an invalid fault', () => {
    expect(() => provisioner.setFault('*', { latencyMs: -1 })).toThrow(/invalid fault/);
    expect(() => provisioner.setFault('*', { probability: 2, hang: true })).toThrow(/invalid fault/);
  });
});

// --- Audit and hooks -----------------------------------------------------------------------------

describe('audit and hooks', () => {
  it('records every API request with what was asked, answered and deleted', async () => {
    await createSandbox('run-1');
    await deleteSandbox('run-1', 1);
    await deleteSandbox('run-1', 1);

    const entries = provisioner.audit();

    expect(entries).toHaveLength(3);
    expect(entries.map((entry) => entry.seq)).toEqual([1, 2, 3]);
    expect(entries[0]).toMatchObject({
      method: 'POST',
      path: '/api/sandboxes',
      sandboxId: 'run-1',
      status: 201,
    });
    expect(entries[1]).toMatchObject({
      method: 'DELETE',
      sandboxId: 'run-1',
      generation: 1,
      status: 200,
      outcome: 'answered',
      deletedGeneration: 1,
    });
    expect(entries[2]).toMatchObject({ status: 404, outcome: 'answered' });
    expect(entries[2]?.deletedGeneration).toBeUndefined();
    for (const entry of entries) expect(entry.endedAt).toBeGreaterThanOrEqual(entry.startedAt);
  });

  it('awaits onRequest hooks before handling, with the request in flight meanwhile', async () => {
    await createSandbox('run-1');
    let releaseHook = () => {};
    const seen: unknown[] = [];
    provisioner.onRequest((info) => {
      seen.push(info);
      if (info.method !== 'DELETE') return;
      return new Promise<void>((resolve) => {
        releaseHook = resolve;
      });
    });

    const pending = deleteSandbox('run-1', 1);
    await provisioner.waitForRequest(isDeleteOf('run-1'), 5000);
    await eventually(() => seen.length === 1, 'the hook to run');
    expect(provisioner.inFlight()).toBe(1);
    expect(liveSandbox('run-1').alive).toBe(true);
    releaseHook();

    expect((await pending).status).toBe(200);
    expect(seen).toEqual([{ method: 'DELETE', sandboxId: 'run-1', generation: 1 }]);
  });

  it('waitForRequest finds a request already in flight and times out when none comes', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { hang: true });
    const pending = deleteSandbox('run-1', 1);
    await provisioner.waitForRequest(isDeleteOf('run-1'), 5000);

    const again = await provisioner.waitForRequest(isDeleteOf('run-1'), 100);
    const never = provisioner.waitForRequest(isDeleteOf('other'), 50);

    expect(again.outcome).toBe('pending');
    await expect(never).rejects.toThrow(/within 50 ms/);
    provisioner.clearFaults();
    expect((await pending).status).toBe(200);
  });
});

// --- Control API -------------------------------------------------------------------------------

describe('control API', () => {
  it('sets and clears faults and lists the audit log and the live sandboxes over HTTP', async () => {
    await createSandbox('run-1');

    const setFault = await call('POST', '/_control/faults', {
      body: { target: 'run-1', fault: { status: 503 } },
    });
    const faulted = await deleteSandbox('run-1', 1);
    const listed = await call('GET', '/_control/sandboxes');
    const cleared = await call('DELETE', '/_control/faults');
    const deleted = await deleteSandbox('run-1', 1);
    const audit = await request(`${provisioner.url}/_control/audit`);
    const entries = (await audit.body.json()) as AuditEntry[];

    expect(setFault.status).toBe(200);
    expect(faulted.status).toBe(503);
    expect(JSON.parse(listed.text)).toEqual([
      expect.objectContaining({ id: 'run-1', generation: 1, alive: true }),
    ]);
    expect(cleared.status).toBe(200);
    expect(deleted.status).toBe(200);
    expect(entries.map((entry) => [entry.method, entry.status])).toEqual([
      ['POST', 201],
      ['DELETE', 503],
      ['DELETE', 200],
    ]);
  });

  it('clears the faults of one target only when asked with ?target=', async () => {
    provisioner.setFault('a', { status: 503 });
    provisioner.setFault('b', { status: 502 });

    const cleared = await call('DELETE', '/_control/faults?target=a');

    expect(cleared.status).toBe(200);
    expect((await deleteSandbox('a', 1)).status).toBe(404);
    expect((await deleteSandbox('b', 1)).status).toBe(502);
  });

  it('sets a fault profile over HTTP and rejects invalid control bodies with 400', async () => {
    const profile = await call('POST', '/_control/fault-profile', { body: { error: 1 } });
    const faulted = await deleteSandbox('missing', 1);
    await call('DELETE', '/_control/fault-profile');
    const normal = await deleteSandbox('missing', 1);
    const badFault = await call('POST', '/_control/faults', {
      body: { target: '*', fault: { explode: true } },
    });
    const badProfile = await call('POST', '/_control/fault-profile', { body: { hang: 0.8, error: 0.8 } });
    const wrongMethod = await call('PUT', '/_control/faults');

    expect(profile.status).toBe(200);
    expect(faulted.status).toBe(503);
    expect(normal.status).toBe(404);
    expect(badFault.status).toBe(400);
    expect(badProfile.status).toBe(400);
    expect(wrongMethod.status).toBe(405);
  });
});

// --- Stopping ------------------------------------------------------------------------------------

describe('stopping', () => {
  it('stop() kills every sandbox process and closes the server', async () => {
    for (const sandboxId of ['a', 'b', 'c']) await createSandbox(sandboxId);
    const pids = provisioner.liveSandboxes().map((sandbox) => sandbox.pid);
    expect(pids.every(isProcessAlive)).toBe(true);

    await provisioner.stop();

    expect(pids.some(isProcessAlive)).toBe(false);
    expect(provisioner.liveSandboxes()).toEqual([]);
    await expect(call('GET', sandboxPath('a'))).rejects.toThrow();
  });

  it('refuses invalid options instead of silently using defaults', async () => {
    const misspelt = { rootDir, graceMS: 10 } as unknown as Parameters<typeof startProvisioner>[0];

    await expect(startProvisioner(misspelt)).rejects.toThrow(/graceMS/);
    await expect(startProvisioner({ rootDir, graceMs: -1 })).rejects.toThrow(/graceMs/);
  });

  it('the CLI stops on SIGTERM and takes its sandboxes with it', async () => {
    const cliRoot = join(rootDir, 'cli');
    const cli = spawn(
      process.execPath,
      ['--import', 'tsx', 'infra/local/provisioner/cli.ts', '--root', cliRoot],
      {
        cwd: REPO_ROOT,
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const exited = once(cli, 'exit');
    try {
      const lines = createInterface({ input: cli.stdout });
      const [firstLine] = (await once(lines, 'line')) as [string];
      const url = /listening on (\S+)/.exec(firstLine)?.[1];
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const created = await request(`${url}/api/sandboxes`, {
        method: 'POST',
        body: JSON.stringify({ sandbox_id: 'cli-run', thread_id: 't', user_id: 'u' }),
      });
      expect(created.statusCode).toBe(201);
      await created.body.dump();
      const listing = await request(`${url}/_control/sandboxes`);
      const [sandbox] = (await listing.body.json()) as Array<{ pid: number }>;
      expect(isProcessAlive(sandbox!.pid)).toBe(true);

      cli.kill('SIGTERM');
      const [code] = await exited;

      expect(code).toBe(0);
      expect(isProcessAlive(sandbox!.pid)).toBe(false);
    } finally {
      if (cli.exitCode === null && cli.signalCode === null) cli.kill('SIGKILL');
    }
  });
});
