/**
 * The local provisioner's audit log and request hooks, its control API, and how it stops.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { type AuditEntry, isProcessAlive, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { commandArgs } from '../support/commands.ts';
import { isRunning } from '../support/processes.ts';
import {
  call,
  createSandbox,
  deleteSandbox,
  eventually,
  isDeleteOf,
  liveSandbox,
  provisioner,
  REPO_ROOT,
  rootDir,
  sandboxPath,
  useProvisionerPerTest,
} from '../support/provisioner-api.ts';

useProvisionerPerTest();

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
    const cli = await startProvisionerCli('cli-term');
    try {
      const pid = await sandboxOf(cli.url);
      expect(isProcessAlive(pid)).toBe(true);

      cli.child.kill('SIGTERM');
      const [code] = await cli.exited;

      expect(code).toBe(0);
      expect(isProcessAlive(pid)).toBe(false);
    } finally {
      cli.stop();
    }
  });

  it('a sandbox outlives no provisioner, not even one killed with SIGKILL (no handler runs)', async () => {
    const cli = await startProvisionerCli('cli-kill');
    try {
      const pid = await sandboxOf(cli.url);
      expect(isProcessAlive(pid)).toBe(true);

      cli.child.kill('SIGKILL');
      await cli.exited;

      // The sandbox waits on a pipe only the provisioner held: its end closed with the process. An
      // exited orphan stays a zombie until its new parent reaps it, which is not the sandbox's doing.
      await eventually(() => !isRunning(pid), 'the orphaned sandbox to exit');
    } finally {
      cli.stop();
    }
  });
});

/** `npm run provisioner`'s program as a child process, listening; `stop` kills it if still running. */
async function startProvisionerCli(name: string) {
  const child = spawn(process.execPath, commandArgs('provisioner', ['--root', join(rootDir, name)]), {
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit');
  const stop = () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  };
  try {
    const lines = createInterface({ input: child.stdout! });
    const [firstLine] = (await once(lines, 'line')) as [string];
    const url = /listening on (\S+)/.exec(firstLine)?.[1];
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    return { child, exited, stop, url: url! };
  } catch (error) {
    stop();
    throw error;
  }
}

/** Creates one sandbox through the CLI's API; its pid, from the control API. */
async function sandboxOf(url: string): Promise<number> {
  const created = await request(`${url}/api/sandboxes`, {
    method: 'POST',
    body: JSON.stringify({ sandbox_id: 'cli-run', thread_id: 't', user_id: 'u' }),
  });
  expect(created.statusCode).toBe(201);
  await created.body.dump();
  const listing = await request(`${url}/_control/sandboxes`);
  const [sandbox] = (await listing.body.json()) as Array<{ pid: number }>;
  return sandbox!.pid;
}
