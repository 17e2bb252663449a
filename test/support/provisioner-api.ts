/**
 * The local provisioner under test, one per test (a fresh root folder, a fixed seed), and a small
 * client for its API. Call `useProvisionerPerTest()` at the top of a test file; `provisioner`,
 * `rootDir` and `extraProvisioners` are live bindings that its hooks replace before each test.
 */
import { access, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, request } from 'undici';
import { afterEach, beforeEach } from 'vitest';
import {
  type AuditEntry,
  type LocalProvisioner,
  startProvisioner,
} from '../../infra/local/provisioner/server.ts';

export const REPO_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

export let rootDir: string;
export let provisioner: LocalProvisioner;
/** Other provisioners a test starts; stopped after it. */
export const extraProvisioners: LocalProvisioner[] = [];

export function useProvisionerPerTest(): void {
  beforeEach(async () => {
    rootDir = await mkdtemp(join(tmpdir(), 'provisioner-test-'));
    provisioner = await startProvisioner({ rootDir, graceMs: 1000, seed: 42 });
  });
  afterEach(async () => {
    await Promise.all([provisioner.stop(), ...extraProvisioners.splice(0).map((other) => other.stop())]);
    await rm(rootDir, { recursive: true, force: true });
  });
}

export interface Reply {
  readonly status: number;
  readonly body: Record<string, unknown>;
  readonly text: string;
}

export async function call(
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

export function createSandbox(sandboxId: string, base?: LocalProvisioner): Promise<Reply> {
  return call('POST', '/api/sandboxes', {
    body: { sandbox_id: sandboxId, thread_id: 't', user_id: 'u' },
    base,
  });
}

/**
 * Dots are encoded too: otherwise the ids `.` and `..` would be dot segments, and a WHATWG URL
 * parser (undici's `request`, fetch) would resolve them away before the request is sent.
 */
export function sandboxPath(sandboxId: string, generation?: number | string): string {
  const query = generation === undefined ? '' : `?generation=${generation}`;
  return `/api/sandboxes/${encodeURIComponent(sandboxId).replaceAll('.', '%2E')}${query}`;
}

/**
 * A request through a bare `Client`, which sends the path exactly as given. WHATWG URL parsing
 * treats even `%2E%2E` as a dot segment, so `request()` cannot address the id `..` at all.
 */
export async function rawCall(method: 'GET' | 'DELETE', path: string): Promise<Reply> {
  const client = new Client(provisioner.url);
  try {
    const response = await client.request({ method, path });
    const text = await response.body.text();
    return { status: response.statusCode, body: JSON.parse(text) as Record<string, unknown>, text };
  } finally {
    await client.close();
  }
}

export function deleteSandbox(
  sandboxId: string,
  generation?: number | string,
  signal?: AbortSignal,
): Promise<Reply> {
  return call('DELETE', sandboxPath(sandboxId, generation), { signal });
}

export async function exists(path: string): Promise<boolean> {
  return access(path).then(
    () => true,
    () => false,
  );
}

/** Polls until `condition` holds; process exit has no event to await from outside. */
export async function eventually(condition: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

export function liveSandbox(sandboxId: string) {
  const sandbox = provisioner.sandbox(sandboxId);
  if (!sandbox) throw new Error(`sandbox ${sandboxId} is not live`);
  return sandbox;
}

export function isDeleteOf(sandboxId: string) {
  return (entry: AuditEntry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId;
}
