/**
 * The two provisioner behaviours the chaos suite's force-clear fault is built on, each shown to
 * happen: a DELETE its client gave up on that the provisioner carries out anyway (as a real one
 * finishes a request it accepted), and one sandbox served as the platform's provisioner serves it
 * (its DELETE ignores the generation) while the others keep the contract's generation guard.
 */
import { describe, expect, it } from 'vitest';
import {
  call,
  createSandbox,
  deleteSandbox,
  eventually,
  isDeleteOf,
  provisioner,
  useProvisionerPerTest,
} from '../support/provisioner-api.ts';

useProvisionerPerTest();

describe('the provisioner modes the chaos suite uses', () => {
  it('a latency with completeIfAbandoned deletes after its client gave up, and says when', async () => {
    await createSandbox('run-1');
    provisioner.setFault('run-1', { latencyMs: 600, completeIfAbandoned: true });
    const abort = new AbortController();

    const pending = deleteSandbox('run-1', 1, abort.signal);
    const arrived = await provisioner.waitForRequest(isDeleteOf('run-1'), 5000);
    abort.abort();
    await expect(pending).rejects.toThrow();
    expect(provisioner.sandbox('run-1')).toBeDefined();

    await eventually(
      () => provisioner.sandbox('run-1') === undefined,
      'the abandoned DELETE to be carried out',
    );
    const entry = provisioner.audit().find((candidate) => candidate.seq === arrived.seq);
    expect(entry).toMatchObject({
      outcome: 'aborted',
      fault: 'latency-complete-if-abandoned',
      deletedGeneration: 1,
    });
    // Deleted after the request ended: what a check of "deleted while a run was active" must use.
    expect(entry!.deletedAt!).toBeGreaterThan(entry!.endedAt!);
  });

  it('a sandbox in platform mode is deleted whatever generation the DELETE names; the others keep the guard', async () => {
    await createSandbox('platform-1');
    await createSandbox('contract-1');
    provisioner.setSandboxMode('platform-1', 'platform');

    const blind = await deleteSandbox('platform-1', 7);
    expect(blind.status).toBe(200);
    expect(provisioner.sandbox('platform-1')).toBeUndefined();

    const guarded = await deleteSandbox('contract-1', 7);
    expect(guarded.status).toBe(409);
    expect(provisioner.sandbox('contract-1')).toBeDefined();

    // Back to the provisioner's own mode: the guard again.
    await createSandbox('platform-1');
    provisioner.setSandboxMode('platform-1', undefined);
    expect((await deleteSandbox('platform-1', 1)).status).toBe(409);
  });

  it('a sandbox in platform mode is listed without its generation; the others keep theirs', async () => {
    await createSandbox('platform-2');
    await createSandbox('contract-2');
    provisioner.setSandboxMode('platform-2', 'platform');
    const listed = (await call('GET', '/api/sandboxes')).body.sandboxes as Array<Record<string, unknown>>;
    const byId = new Map(listed.map((entry) => [entry.sandbox_id, entry]));
    expect(byId.get('platform-2')).not.toHaveProperty('generation');
    expect(byId.get('contract-2')).toMatchObject({ generation: 1 });
  });

  it.each([
    [202, 'status:202+deleted-later'],
    [200, 'status:200+deleted-later'],
  ])(
    'a %i "deleting" answers at once and deletes later, with a hook awaited at that moment',
    async (status, label) => {
      await createSandbox('async-1');
      provisioner.setFault('async-1', {
        status,
        body: '{"status":"deleting"}',
        contentType: 'application/json',
        deleteAfterMs: 400,
        times: 1,
      });
      const seenLive: boolean[] = [];
      const remove = provisioner.onDeferredDelete((info) => {
        if (info.sandboxId === 'async-1') seenLive.push(provisioner.sandbox('async-1') !== undefined);
      });
      const answer = await deleteSandbox('async-1', 1);
      expect(answer.status).toBe(status);
      expect(answer.body).toEqual({ status: 'deleting' });
      expect(provisioner.sandbox('async-1')).toBeDefined();

      await eventually(
        () => provisioner.sandbox('async-1') === undefined,
        'the answered DELETE to be carried out',
      );
      remove();
      // The hook ran once, while the sandbox was still there: a check at the moment it really goes.
      expect(seenLive).toEqual([true]);
      const entry = provisioner.audit().find((candidate) => candidate.method === 'DELETE');
      expect(entry).toMatchObject({ outcome: 'answered', status, fault: label, deletedGeneration: 1 });
      expect(entry!.deletedAt! - entry!.endedAt!).toBeGreaterThanOrEqual(300);
    },
  );
});
