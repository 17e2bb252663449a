/**
 * `ops reclaim --yes` from an operator's shell never acts with weaker settings than the deployment
 * (issue 21, item 4): the deployed reclaimer records its settings in the database, and the command
 * applies the larger of its own and the recorded ones, saying so. A child process, as an operator
 * runs it, against a real database and the real local provisioner.
 */
import { afterEach, expect, it } from 'vitest';
import { type ReclaimSettings, settingsOfRecord } from '../../functions/cleanup/reclaim.ts';
import { ExitCode } from '../../infra/ops/exit-codes.ts';
import { insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { letTimePass } from '../support/reclaim-time.ts';

const fixture = useProvisionerFixture();

afterEach(async () => {
  await fixture.t.db.query('DELETE FROM runtime_cleanup_settings; DELETE FROM runtime_reclaim_sightings');
});

/** The deployed reclaimer's settings (grace one hour), as it records them at every run. */
const DEPLOYED: ReclaimSettings = {
  graceSeconds: 3600,
  maxPerRun: 50,
  maxSharePercent: 50,
  runtimeCleanupTimeoutMs: 155_000,
  provisionerDeleteTimeoutSeconds: 120,
  lockTimeoutMs: 5_000,
  recordAs: 'reclaimer',
};

async function recorded(): Promise<Record<string, number>> {
  const { rows } = await fixture.t.db.query<{ name: string; value: number }>(
    'SELECT name, value FROM runtime_cleanup_settings',
  );
  return Object.fromEntries(rows.map((row) => [row.name, Number(row.value)]));
}

/** A leak that any grace at all makes due: unrecorded, sighted by a run a day ago. */
async function leak(sandboxId: string): Promise<void> {
  await fetch(new URL('/api/sandboxes', fixture.provisioner.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 't', user_id: 'u' }),
  });
}

const deletesOf = (sandboxId: string) =>
  fixture.provisioner.audit().filter((entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId);

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
  await settingsOfRecord(db, DEPLOYED);
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

it('refuses --yes where the deployment has recorded no settings (exit 1, nothing listed, recorded or deleted)', async () => {
  await leak('sbx-no-record');
  const listsBefore = fixture.provisioner.audit().filter((entry) => entry.method === 'GET').length;
  const [text, json] = await Promise.all([ops(['reclaim', '--yes']), ops(['reclaim', '--yes', '--json'])]);
  expect(text.code).toBe(ExitCode.REFUSED);
  expect(text.stderr).toMatch(/NO_SETTINGS_OF_RECORD/);
  expect(text.stderr).toMatch(/no settings of record for reclaim_grace_seconds/);
  expect(text.stderr).toMatch(/RECLAIM_GRACE_SECONDS=1\b/);
  expect(text.stderr).toMatch(/--settings-from-environment/);
  expect(json.code).toBe(ExitCode.REFUSED);
  expect(JSON.parse(json.stdout)).toMatchObject({ error: { code: 'NO_SETTINGS_OF_RECORD' } });
  expect(fixture.provisioner.audit().filter((entry) => entry.method === 'GET').length).toBe(listsBefore);
  expect(deletesOf('sbx-no-record')).toEqual([]);
  expect(await recorded()).toEqual({});
  const { rows } = await fixture.t.db.query('SELECT 1 FROM runtime_reclaim_sightings');
  expect(rows).toEqual([]);
  // The dry run still answers: it changes nothing whatever the settings.
  const dry = await ops(['reclaim']);
  expect(dry.code, dry.stderr).toBe(0);
});

it("acts on the shell's settings with --settings-from-environment, prints them, and records none", async () => {
  await leak('sbx-from-env');
  const first = await ops(['reclaim', '--yes', '--settings-from-environment', '--json']);
  expect(first.code, first.stderr).toBe(0);
  const result = JSON.parse(first.stdout) as {
    settings: { graceSeconds: number; recorded: unknown[] };
    settingsFromEnvironment: string[];
  };
  expect(result.settings.graceSeconds).toBe(1);
  expect(result.settings.recorded).toEqual([]);
  expect(result.settingsFromEnvironment).toContain('reclaim_grace_seconds');
  await letTimePass(fixture.t.db, 2); // past the shell's grace of a second

  const second = await ops(['reclaim', '--yes', '--settings-from-environment']);
  expect(second.code, second.stderr).toBe(0);
  expect(second.stdout).toMatch(/No settings of record for reclaim_grace_seconds\b.*this shell's were used/);
  expect(second.stdout).toMatch(/Settings: grace 1 s, .* from this shell's configuration/);
  expect(second.stdout).toMatch(/reclaimed sbx-from-env/);
  expect(fixture.provisioner.sandbox('sbx-from-env')).toBeUndefined();
  // An operator's run never records: the deployment's reclaimer is the only author.
  expect(await recorded()).toEqual({});
});

it('a looser record does not lower the settings of record until the stricter one is 900 s old', async () => {
  const db = fixture.t.db;
  await settingsOfRecord(db, DEPLOYED);
  // Redeployed with a shorter grace and a looser share while a worker of the old version still runs.
  const redeployed = {
    ...DEPLOYED,
    graceSeconds: 60,
    maxSharePercent: 90,
    maxPerRun: 500,
    recordAs: 'reclaimer v2',
  };
  const during = await settingsOfRecord(db, redeployed);
  expect(during.effective).toMatchObject({ graceSeconds: 3600, maxSharePercent: 50, maxPerRun: 50 });
  expect(await recorded()).toMatchObject({
    reclaim_grace_seconds: 3600,
    reclaim_max_share_percent: 50,
    reclaim_max_per_run: 50,
  });
  // A stricter record replaces at once.
  await settingsOfRecord(db, { ...DEPLOYED, graceSeconds: 7200 });
  expect((await recorded()).reclaim_grace_seconds).toBe(7200);
  // Once nobody has recorded the stricter values for 900 s, the redeployed stage's are in force.
  await letTimePass(db, 890);
  await settingsOfRecord(db, redeployed);
  expect((await recorded()).reclaim_grace_seconds).toBe(7200);
  await letTimePass(db, 11);
  const after = await settingsOfRecord(db, redeployed);
  expect(after.effective).toMatchObject({ graceSeconds: 60, maxSharePercent: 90, maxPerRun: 500 });
  expect(after.recorded.every((row) => row.recordedBy === 'reclaimer v2')).toBe(true);
});
