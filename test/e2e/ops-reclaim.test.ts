/**
 * `ops orphans` and `ops reclaim` as an operator runs them (a child process), against a real
 * database and the real local provisioner: what they print, and the exit codes scripts rely on.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import type { ChildRun } from '../support/child-process.ts';
import { insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { letTimePass } from '../support/reclaim-time.ts';

const fixture = useProvisionerFixture();

function ops(args: string[], env: Record<string, string> = {}): Promise<ChildRun> {
  return runOpsCli(args, {
    env: {
      DATABASE_URL: fixture.t.url,
      DATABASE_WS_PROXY: fixture.t.wsProxy,
      SANDBOX_PROVISIONER_URL: fixture.provisioner.url,
      RECLAIM_GRACE_SECONDS: '1',
      RECLAIM_MAX_SHARE_PERCENT: '100',
      ...env,
    },
    timeoutMs: 30_000,
  });
}

function json<T = Record<string, unknown>>(run: ChildRun): T {
  try {
    return JSON.parse(run.stdout) as T;
  } catch {
    throw new Error(`not JSON (exit ${run.code}):\n${run.stdout}\nstderr:\n${run.stderr}`);
  }
}

async function post(sandboxId: string): Promise<number> {
  const response = await fetch(new URL('/api/sandboxes', fixture.provisioner.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 't', user_id: 'u' }),
  });
  return ((await response.json()) as { generation: number }).generation;
}

describe('ops orphans and ops reclaim', () => {
  it('shows the leak and why, deletes it only with --yes once due, and keeps an active scope', async () => {
    const db = fixture.t.db;
    await post('sbx-ops-leak');
    const conversation = await insertConversation(db, { uid: 'u-ops' });
    const scope = {
      uid: 'u-ops',
      runtimeScopeId: 'scope-ops',
      threadId: conversation.threadId,
      conversationId: conversation.id,
    };
    await upsertSandbox(db, {
      ...scope,
      sandboxId: 'sbx-ops-owned',
      generation: await post('sbx-ops-owned'),
    });
    await insertRun(db, { ...scope, status: 'running' });

    const first = await ops(['orphans', '--json']);
    expect(first.code, first.stderr).toBe(0);
    const listed = json<{
      listed: number;
      leaked: Array<{ sandboxId: string; reason: string; waiting: string }>;
      due: string[];
    }>(first);
    expect(listed.listed).toBe(2);
    expect(listed.leaked).toEqual([
      expect.objectContaining({ sandboxId: 'sbx-ops-leak', reason: 'unrecorded' }),
    ]);
    expect(listed.due).toEqual([]);

    // A dry run records nothing: reclaim --yes starts the streak, and only a later one deletes.
    // No deployed reclaimer has recorded its settings here: this shell's grace of a second is
    // used only because it is asked for (ops-reclaim-settings.test.ts has the refusal).
    const start = await ops(['reclaim', '--yes', '--settings-from-environment', '--json']);
    expect(start.code, start.stderr).toBe(0);
    expect(json(start)).toMatchObject({ applied: true, reclaimed: 0, leaked: 1 });
    await new Promise((resolve) => setTimeout(resolve, 1_200));

    const dry = await ops(['reclaim']);
    expect(dry.code).toBe(0);
    expect(dry.stdout).toContain('Dry run: nothing was changed');
    expect(dry.stdout).toContain('sbx-ops-leak');
    expect(fixture.provisioner.sandbox('sbx-ops-leak')).toBeDefined();

    const done = await ops(['reclaim', '--yes', '--settings-from-environment', '--json']);
    expect(done.code, done.stderr).toBe(0);
    expect(json(done)).toMatchObject({
      reclaimed: 1,
      events: [{ kind: 'reclaimed', sandboxId: 'sbx-ops-leak', reason: 'unrecorded' }],
    });
    expect(fixture.provisioner.sandbox('sbx-ops-leak')).toBeUndefined();
    expect(fixture.provisioner.sandbox('sbx-ops-owned')).toBeDefined();
  });

  it('exit 1 for a listing it refuses, 3 for an unreachable provisioner, 2 without a provisioner URL', async () => {
    const hostile = createServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/html' });
      response.end('<html>not the provisioner</html>');
    });
    await new Promise<void>((resolve) => hostile.listen(0, '127.0.0.1', resolve));
    const hostileUrl = `http://127.0.0.1:${(hostile.address() as AddressInfo).port}`;
    try {
      const [refused, unreachable, missing] = await Promise.all([
        ops(['orphans', '--json'], { SANDBOX_PROVISIONER_URL: hostileUrl }),
        ops(['reclaim', '--yes', '--settings-from-environment'], {
          SANDBOX_PROVISIONER_URL: 'http://127.0.0.1:1',
        }),
        ops(['orphans'], { SANDBOX_PROVISIONER_URL: '' }),
      ]);
      expect(refused.code).toBe(1);
      expect(json(refused)).toMatchObject({ refused: 'list_not_json' });
      expect(unreachable.code).toBe(3);
      expect(unreachable.stdout + unreachable.stderr).toContain('list_unavailable');
      expect(missing.code).toBe(2);
      expect(missing.stderr).toContain('SANDBOX_PROVISIONER_URL');
    } finally {
      await new Promise((resolve) => hostile.close(resolve));
    }
  });
});

/**
 * The operator's view of the DateStyle finding: ops runs its reads inside transactions, which pin
 * DateStyle and TimeZone (infra/ops/context.ts), so this held before every connection was pinned
 * too; it keeps holding whichever way a later change sends them.
 */
describe("under a database whose DateStyle is 'SQL, DMY'", () => {
  it('orphans prints the streak start as an ISO instant, and reclaim --yes reclaims as under ISO', async () => {
    await fixture.t.setDateStyle('SQL, DMY');
    try {
      const sandboxId = 'sbx-ops-datestyle';
      await post(sandboxId);
      const start = await ops(['reclaim', '--yes', '--settings-from-environment', '--json']);
      expect(start.code, start.stderr).toBe(0);

      const listed = await ops(['orphans', '--json']);
      expect(listed.code, listed.stderr).toBe(0);
      const leak = json<{ leaked: Array<{ sandboxId: string; seenLeakedSince: string | null }> }>(
        listed,
      ).leaked.find((each) => each.sandboxId === sandboxId);
      expect(leak?.seenLeakedSince).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
      expect(Math.abs(Date.parse(leak!.seenLeakedSince!) - Date.now())).toBeLessThan(60_000);
      const text = await ops(['orphans']);
      expect(text.stdout).toMatch(new RegExp(`${sandboxId}\\b.*\\b${leak!.seenLeakedSince!.slice(0, 16)}`));

      await letTimePass(fixture.t.db, 2); // past the shell's grace of a second
      const done = await ops(['reclaim', '--yes', '--settings-from-environment', '--json']);
      expect(done.code, done.stderr).toBe(0);
      expect(json<{ events: Array<{ kind: string; sandboxId: string }> }>(done).events).toContainEqual(
        expect.objectContaining({ kind: 'reclaimed', sandboxId }),
      );
      expect(fixture.provisioner.sandbox(sandboxId)).toBeUndefined();
    } finally {
      await fixture.t.setDateStyle(null);
    }
  });
});
