/**
 * `ops reclaim --yes` from an operator's shell never acts with weaker settings than the deployment
 * (issue 21, item 4): the deployed reclaimer records its settings in the database, and the command
 * applies the larger of its own and the recorded ones, saying so. A child process, as an operator
 * runs it, against a real database and the real local provisioner.
 */
import { expect, it } from 'vitest';
import { settingsOfRecord } from '../../functions/cleanup/reclaim.ts';
import { insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { letTimePass } from '../support/reclaim-time.ts';

const fixture = useProvisionerFixture();

function ops(args: string[]) {
  return runOpsCli(args, {
    env: {
      DATABASE_URL: fixture.t.url,
      DATABASE_WS_PROXY: fixture.t.wsProxy,
      SANDBOX_PROVISIONER_URL: fixture.provisioner.url,
      // The operator's shell: a grace of a second, the brakes off.
      RECLAIM_GRACE_SECONDS: '1',
      RECLAIM_MAX_SHARE_PERCENT: '100',
    },
    timeoutMs: 90_000,
  });
}

it("applies the deployment's recorded grace, not the shell's, and says so", async () => {
  const db = fixture.t.db;
  // The deployed reclaimer (grace one hour) recorded its settings at its last run.
  await settingsOfRecord(db, {
    graceSeconds: 3600,
    maxPerRun: 50,
    maxSharePercent: 50,
    runtimeCleanupTimeoutMs: 155_000,
    provisionerDeleteTimeoutSeconds: 120,
    lockTimeoutMs: 5_000,
    recordAs: 'reclaimer',
  });
  const conversation = await insertConversation(db, { uid: 'u-settings' });
  const scope = {
    uid: 'u-settings',
    runtimeScopeId: 'scope-settings',
    threadId: conversation.threadId,
    conversationId: conversation.id,
  };
  const response = await fetch(new URL('/api/sandboxes', fixture.provisioner.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: 'sbx-settings', thread_id: 't', user_id: 'u' }),
  });
  const { generation } = (await response.json()) as { generation: number };
  await upsertSandbox(db, { ...scope, sandboxId: 'sbx-settings', generation });
  await insertRun(db, { ...scope, status: 'completed' });

  const first = await ops(['reclaim', '--yes', '--json']); // the first sighting
  expect(first.code, first.stderr).toBe(0);
  await letTimePass(db, 60); // a minute: past the shell's grace, far within the deployment's

  const second = await ops(['reclaim', '--yes', '--json']);
  expect(second.code, second.stderr).toBe(0);
  const result = JSON.parse(second.stdout) as {
    reclaimed: number;
    settings: { graceSeconds: number; tightened: string[]; recorded: Array<{ recordedBy: string }> };
  };
  expect(result.reclaimed).toBe(0);
  expect(result.settings.graceSeconds).toBe(3600);
  expect(result.settings.tightened).toContain('reclaim_grace_seconds');
  expect(result.settings.recorded[0]?.recordedBy).toBe('reclaimer');
  expect(fixture.provisioner.sandbox('sbx-settings')).toBeDefined();

  const text = await ops(['reclaim', '--yes']);
  expect(text.stdout).toMatch(/grace 3600 s/);
  expect(text.stdout).toMatch(/stricter than this shell's in reclaim_grace_seconds/);
});
