import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { parseHttpDate } from '../../functions/adapters/retry-after.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';

/**
 * The local provisioner's fault kinds for the replies of contract v1.1 §3, over real HTTP: a
 * status with a Retry-After (delta-seconds or an HTTP-date computed when the answer is written),
 * a catch-all server's 200 (an HTML page, an empty body), and an honest 410 after a real delete.
 */
let rootDir: string;
let provisioner: LocalProvisioner;

beforeEach(async () => {
  rootDir = await mkdtemp(join(tmpdir(), 'provisioner-reply-faults-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 500, seed: 7 });
});

afterEach(async () => {
  await provisioner.stop();
  await rm(rootDir, { recursive: true, force: true });
});

async function create(sandboxId: string): Promise<number> {
  const response = await request(`${provisioner.url}/api/sandboxes`, {
    method: 'POST',
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 'thread', user_id: 'user' }),
    headers: { 'content-type': 'application/json' },
  });
  return ((await response.body.json()) as { generation: number }).generation;
}

async function remove(sandboxId: string, generation: number) {
  const response = await request(`${provisioner.url}/api/sandboxes/${sandboxId}?generation=${generation}`, {
    method: 'DELETE',
  });
  return { status: response.statusCode, headers: response.headers, text: await response.body.text() };
}

describe('status faults with a Retry-After', () => {
  it('send delta-seconds as given, and leave the sandbox alone', async () => {
    const generation = await create('sbx-429');
    provisioner.setFault('sbx-429', { status: 429, retryAfter: { seconds: 7, as: 'delta-seconds' } });

    const reply = await remove('sbx-429', generation);

    expect(reply.status).toBe(429);
    expect(reply.headers['retry-after']).toBe('7');
    expect(provisioner.sandbox('sbx-429')?.alive).toBe(true);
    const entry = provisioner.audit().at(-1);
    expect(entry?.fault).toBe('status:429+retry-after');
    // What a retry is judged by (chaos invariant R): the answer's own ask.
    expect(entry?.retryAfter).toBe('7');
    expect(entry?.retryAfterAskedMs).toBe(7_000);
  });

  it('send an IMF-fixdate at least the given seconds after the moment of the answer', async () => {
    const generation = await create('sbx-503');
    provisioner.setFault('sbx-503', { status: 503, retryAfter: { seconds: 30, as: 'http-date' } });

    const before = Date.now();
    const reply = await remove('sbx-503', generation);

    const header = reply.headers['retry-after'] as string;
    expect(header).toMatch(/^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/);
    const date = parseHttpDate(header)!;
    expect(date).toBeGreaterThanOrEqual(before + 30_000);
    expect(date).toBeLessThanOrEqual(Date.now() + 31_000);
    // The ask recorded is the time left until that date, as the date was written.
    const entry = provisioner.audit().at(-1)!;
    expect(entry.retryAfter).toBe(header);
    expect(entry.retryAfterAskedMs).toBeGreaterThanOrEqual(30_000);
    expect(entry.retryAfterAskedMs).toBeLessThanOrEqual(31_000);
    expect(date - entry.retryAfterAskedMs!).toBeGreaterThanOrEqual(before);
    expect(date - entry.retryAfterAskedMs!).toBeLessThanOrEqual(Date.now());
  });

  it('send a raw (hostile) value as it is', async () => {
    const generation = await create('sbx-raw');
    provisioner.setFault('sbx-raw', { status: 429, retryAfter: 'after lunch' });

    expect((await remove('sbx-raw', generation)).headers['retry-after']).toBe('after lunch');
    // Its meaning is unknown, so no ask is recorded for it.
    expect(provisioner.audit().at(-1)?.retryAfterAskedMs).toBeUndefined();
  });
});

describe("a catch-all server's 200", () => {
  it('answers an HTML page with its content type and deletes nothing', async () => {
    const generation = await create('sbx-html');
    const page = '<!doctype html><html><body>It works!</body></html>';
    provisioner.setFault('sbx-html', { status: 200, contentType: 'text/html; charset=utf-8', body: page });

    const reply = await remove('sbx-html', generation);

    expect(reply).toMatchObject({ status: 200, text: page });
    expect(reply.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(provisioner.sandbox('sbx-html')?.alive).toBe(true);
  });

  it('answers an empty body and deletes nothing', async () => {
    const generation = await create('sbx-empty');
    provisioner.setFault('sbx-empty', { status: 200, body: '' });

    const reply = await remove('sbx-empty', generation);

    expect(reply).toMatchObject({ status: 200, text: '' });
    expect(reply.headers['content-length']).toBe('0');
    expect(provisioner.sandbox('sbx-empty')?.alive).toBe(true);
  });
});

describe('the gone fault', () => {
  it('deletes for real and answers 410 instead of 200', async () => {
    const generation = await create('sbx-gone');
    provisioner.setFault('sbx-gone', { gone: true });

    expect((await remove('sbx-gone', generation)).status).toBe(410);
    expect(provisioner.sandbox('sbx-gone')).toBeUndefined();
    expect(provisioner.audit().at(-1)).toMatchObject({ fault: 'gone', status: 410, deletedGeneration: 1 });
  });

  it('answers 410 instead of 404 for a sandbox that does not exist, and passes a 409 through', async () => {
    provisioner.setFault('*', { gone: true });
    expect((await remove('sbx-never', 1)).status).toBe(410);

    const generation = await create('sbx-newer');
    expect((await remove('sbx-newer', generation + 1)).status).toBe(409);
    expect(provisioner.sandbox('sbx-newer')?.alive).toBe(true);
  });
});

describe('fault validation', () => {
  it.each([
    ['a fractional Retry-After', { status: 429, retryAfter: { seconds: 1.5, as: 'delta-seconds' } }],
    ['an unknown Retry-After form', { status: 429, retryAfter: { seconds: 5, as: 'weeks' } }],
    ['gone: false', { gone: false }],
    ['an empty content type', { status: 200, contentType: '' }],
  ])('rejects %s', (_name, fault) => {
    expect(() => provisioner.setFault('sbx', fault as never)).toThrow(/invalid fault/);
  });
});
