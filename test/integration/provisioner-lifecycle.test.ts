/**
 * The local provisioner (the contract's provisioner API, sandboxes as real processes): a sandbox's
 * lifecycle from create to delete, generations, ids that need encoding, and concurrent deletes.
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { isProcessAlive, startProvisioner } from '../../infra/local/provisioner/server.ts';
import {
  call,
  createSandbox,
  deleteSandbox,
  eventually,
  exists,
  extraProvisioners,
  liveSandbox,
  provisioner,
  rawCall,
  rootDir,
  sandboxPath,
  useProvisionerPerTest,
} from '../support/provisioner-api.ts';

useProvisionerPerTest();

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
    expect(missing).toMatchObject({ status: 404, body: { error: 'no such sandbox', sandbox_id: 'never' } });
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
    // An unknown route is a plain-text 404 page, unlike an unknown sandbox's JSON 404: a cleanup
    // pointed at a wrong path prefix must not read it as "no such sandbox".
    expect(results[8]?.text).toMatch(/^no such route: GET \/api\/unknown/);
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
    // Until its trap ignores SIGTERM (it then writes `ready`), SIGTERM would kill it outright.
    await eventually(() => existsSync(join(sandbox.dir, 'ready')), 'the sandbox to install its trap');

    const started = performance.now();
    const deleted = await call('DELETE', sandboxPath('run-1', 1), { base: stubborn });

    expect(deleted.status).toBe(200);
    expect(performance.now() - started).toBeGreaterThanOrEqual(150);
    expect(isProcessAlive(sandbox.pid)).toBe(false);
  });
});

// --- Concurrency -------------------------------------------------------------------------------

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
