/**
 * The local provisioner's fault table: every misbehaviour the chaos suite and the demo inject
 * (latency, hangs, statuses, resets, conflicts, slow and oversized bodies), each shown to happen.
 */
import { join } from 'node:path';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { isProcessAlive, startProvisioner } from '../../infra/local/provisioner/server.ts';
import {
  call,
  createSandbox,
  deleteSandbox,
  eventually,
  extraProvisioners,
  isDeleteOf,
  liveSandbox,
  provisioner,
  rootDir,
  sandboxPath,
  useProvisionerPerTest,
} from '../support/provisioner-api.ts';

useProvisionerPerTest();

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
