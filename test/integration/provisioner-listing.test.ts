/**
 * The local provisioner's list endpoint (contract v1.1 section 3, docs/integration.md) in both of
 * its modes, and the platform-compatible mode that models the platform's deployed provisioner.
 */
import { join } from 'node:path';
import { beforeEach, describe, expect, it } from 'vitest';
import {
  isProcessAlive,
  type LocalProvisioner,
  startProvisioner,
} from '../../infra/local/provisioner/server.ts';
import {
  call,
  createSandbox,
  deleteSandbox,
  extraProvisioners,
  isDeleteOf,
  provisioner,
  rootDir,
  sandboxPath,
  useProvisionerPerTest,
} from '../support/provisioner-api.ts';

useProvisionerPerTest();

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
          created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
          generation: 1,
        },
        {
          sandbox_id: 'run-b',
          sandbox_url: `${provisioner.url}/sandboxes/run-b`,
          status: 'running',
          created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
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
      sandboxes: [
        {
          sandbox_id: 'run-1',
          sandbox_url: `${platform.url}/sandboxes/run-1`,
          status: 'running',
          created_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
        },
      ],
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
