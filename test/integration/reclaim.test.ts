/**
 * The reclaimer (issue 13) against real PostgreSQL and the real local provisioner, in both of its
 * modes: every leak kind is reclaimed within two intervals after the grace; a sandbox whose scope
 * has an active run, a pending fence or a creation younger than the grace is never deleted, even
 * when the scope becomes active between the listing and the DELETE; the share bound stops a
 * runaway listing; the per-run bound defers the rest.
 */
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import type { Queues } from '../../functions/adapters/queues.ts';
import {
  classifyListing,
  LeakReason,
  provisionerIdentity,
  type ReclaimEvent,
  type ReclaimSettings,
  reclaimOne,
  recordSightings,
  runReclaim,
} from '../../functions/cleanup/reclaim.ts';
import { ReclaimVerdict } from '../../functions/cleanup/reclaim-guard.ts';
import { ReclaimRefusal, ReclaimRefusedError } from '../../functions/cleanup/reclaim-listing.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import { PlatformSimulator } from '../../infra/local/platform.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf } from '../support/probes.ts';
import { letTimePass } from '../support/reclaim-time.ts';
import { eventually } from '../support/stack.ts';

const database = useDatabaseFixture();

// Time passes by injection (letTimePass), so the grace can be long: the real seconds a loaded
// machine spends between two listings are then small beside every margin the tests state.
const GRACE_SECONDS = 600;

const INTERVAL_SECONDS = 60;

let rootDir: string;
let provisioner: LocalProvisioner;
let client: ProvisionerClient;
let provider: SandboxProvider;

async function startLocal(mode: 'contract' | 'platform'): Promise<void> {
  rootDir = await mkdtemp(join(tmpdir(), 'rc-reclaim-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 300, mode });
  client = new ProvisionerClient(provisioner.url);
  provider = new SandboxProvider({ client, releaseLockTimeoutMs: 5_000, provisionerDeleteTimeoutMs: 5_000 });
}

afterEach(async () => {
  await client?.close();
  await provisioner?.stop();
  if (rootDir) await rm(rootDir, { recursive: true, force: true });
  await database.t.db.query('DELETE FROM runtime_reclaim_sightings');
});

function settings(overrides: Partial<ReclaimSettings> = {}): ReclaimSettings & { listTimeoutMs: number } {
  return {
    graceSeconds: GRACE_SECONDS,
    maxPerRun: 50,
    maxSharePercent: 100,
    runtimeCleanupTimeoutMs: 15_000,
    provisionerDeleteTimeoutSeconds: 5,
    lockTimeoutMs: 5_000,
    listTimeoutMs: 5_000,
    ...overrides,
  };
}

function run(overrides: Partial<ReclaimSettings> = {}, events: ReclaimEvent[] = []) {
  return runReclaim(
    {
      db: database.t.db,
      provider,
      lister: client,
      provisioner: provisionerIdentity(provisioner!.url),
      onEvent: (event) => events.push(event),
    },
    settings(overrides),
  );
}

async function post(sandboxId: string): Promise<number> {
  const response = await fetch(new URL('/api/sandboxes', provisioner.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 't', user_id: 'u' }),
  });
  const body = (await response.json()) as { generation?: number };
  return body.generation ?? 1;
}

interface Scope {
  uid: string;
  runtimeScopeId: string;
  threadId: string;
  conversationId: number;
}

async function scope(): Promise<Scope> {
  const uid = `user-${randomUUID().slice(0, 8)}`;
  const conversation = await insertConversation(database.t.db, { uid });
  return {
    uid,
    runtimeScopeId: `scope-${randomUUID().slice(0, 8)}`,
    threadId: conversation.threadId,
    conversationId: conversation.id,
  };
}

async function runIn(s: Scope, status: string, fence = false): Promise<string> {
  return insertRun(database.t.db, { ...s, status, fence });
}

/** Each leak kind of the issue, made the way it happens. Returns sandbox id → expected reason. */
async function makeLeaks(): Promise<Map<string, LeakReason>> {
  const db = database.t.db;
  const leaks = new Map<string, LeakReason>();

  // 1. The platform crashed between POST /api/sandboxes and recording it: the run was admitted,
  //    the sandbox created, nothing recorded; the run was later marked interrupted.
  const crashed = await scope();
  await runIn(crashed, 'interrupted');
  const crashedId = `sbx-${crashed.runtimeScopeId}`;
  await post(crashedId);
  leaks.set(crashedId, LeakReason.UNRECORDED);

  // 2. A generation replaced without a cleanup: the scope moved to a new sandbox id; the old one
  //    is still live and named by nobody. The new one is the scope's live, unreleased sandbox
  //    with no run and no fence since (no cleanup ever ran for it): leaked as well.
  const replaced = await scope();
  await runIn(replaced, 'completed');
  const oldId = `sbx-old-${replaced.runtimeScopeId}`;
  await post(oldId);
  await upsertSandbox(db, { ...replaced, sandboxId: oldId, generation: 1 });
  const newId = `sbx-new-${replaced.runtimeScopeId}`;
  const newGeneration = await post(newId);
  await upsertSandbox(db, { ...replaced, sandboxId: newId, generation: newGeneration });
  leaks.set(oldId, LeakReason.UNRECORDED);
  leaks.set(newId, LeakReason.CLEANUP_NEVER_RAN);

  // 3. An operator force-cleared the fence and never sent the printed DELETE.
  const forced = await scope();
  const forcedId = `sbx-${forced.runtimeScopeId}`;
  const forcedGeneration = await post(forcedId);
  await upsertSandbox(db, { ...forced, sandboxId: forcedId, generation: forcedGeneration });
  const forcedRun = await runIn(forced, 'completed', true);
  await db.query('UPDATE agent_runs SET runtime_cleanup_pending = false WHERE id = $1::text', [forcedRun]);
  await db.query(
    `INSERT INTO runtime_cleanup_overrides (run_id, uid, runtime_scope_id, sandbox_id, generation, reason, actor)
     VALUES ($1::text, $2::text, $3::text, $4::text, $5::bigint, 'incident 42', 'oncall')`,
    [forcedRun, forced.uid, forced.runtimeScopeId, forcedId, forcedGeneration],
  );
  leaks.set(forcedId, LeakReason.CLEANUP_NEVER_RAN);

  // 4. The provisioner answered 404 to the cleanup's DELETE and kept the sandbox: the generation
  //    is marked released (as finalize marks it: the mark names the generation), the sandbox
  //    still listed.
  const kept = await scope();
  const keptId = `sbx-${kept.runtimeScopeId}`;
  const keptGeneration = await post(keptId);
  await upsertSandbox(db, { ...kept, sandboxId: keptId, generation: keptGeneration });
  await runIn(kept, 'completed');
  await db.query(
    `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
     WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [kept.uid, kept.runtimeScopeId],
  );
  leaks.set(keptId, LeakReason.KEPT_AFTER_RELEASE);
  return leaks;
}

/** Sandboxes that must survive every pass: each owned by its scope. */
async function makeOwned(): Promise<string[]> {
  const db = database.t.db;
  // An active run (long quiet: an idle reaper would take it).
  const active = await scope();
  const activeId = `sbx-${active.runtimeScopeId}`;
  await upsertSandbox(db, { ...active, sandboxId: activeId, generation: await post(activeId) });
  await runIn(active, 'running');
  await db.query(
    "UPDATE agent_runs SET created_at = now() - interval '3 days', updated_at = now() - interval '3 days' WHERE uid = $1::text",
    [active.uid],
  );
  // A pending fence: its cleanup owns the delete.
  const fenced = await scope();
  const fencedId = `sbx-${fenced.runtimeScopeId}`;
  await upsertSandbox(db, { ...fenced, sandboxId: fencedId, generation: await post(fencedId) });
  await runIn(fenced, 'completed', true);
  // A subagent still running under a finished root: the scope is active.
  const sub = await scope();
  const subId = `sbx-${sub.runtimeScopeId}`;
  await upsertSandbox(db, { ...sub, sandboxId: subId, generation: await post(subId) });
  const root = await runIn(sub, 'completed');
  await insertRun(db, { ...sub, status: 'running', runType: 'subagent', createdByRunId: root });
  return [activeId, fencedId, subId];
}

describe.each(['contract', 'platform'] as const)('the reclaimer against the %s provisioner', (mode) => {
  beforeEach(async () => {
    await startLocal(mode);
  });

  it('reclaims every leak kind at the first listing a whole grace after it was first seen leaked, and nothing owned', async () => {
    const leaks = await makeLeaks();
    const owned = await makeOwned();
    const deleted = () => provisioner.audit().filter((entry) => entry.method === 'DELETE');
    const reasons = new Map<string, string | null>();
    const pass = async () => {
      const events: ReclaimEvent[] = [];
      const report = await run({}, events);
      for (const event of events) {
        if (event.kind === 'reclaimed') reasons.set(event.sandbox.sandboxId, event.sandbox.reason);
      }
      return report;
    };
    // The first listing starts every streak; the listings within the grace delete nothing.
    expect(new Set((await pass()).leaked.map((sandbox) => sandbox.sandboxId))).toEqual(new Set(leaks.keys()));
    await letTimePass(database.t.db, INTERVAL_SECONDS);
    await pass();
    await letTimePass(database.t.db, GRACE_SECONDS - INTERVAL_SECONDS - 30);
    await pass();
    expect(deleted()).toEqual([]);
    // The next listing, a whole grace after the first: every leak, and only the leaks.
    await letTimePass(database.t.db, INTERVAL_SECONDS);
    const report = await pass();
    expect(report.reclaimed).toBe(leaks.size);
    for (const [id, reason] of leaks) {
      expect(provisioner.sandbox(id), `${id} reclaimed`).toBeUndefined();
      expect(reasons.get(id), id).toBe(reason);
    }
    for (const id of owned) expect(provisioner.sandbox(id), `${id} owned`).toBeDefined();
    expect(new Set(deleted().map((entry) => entry.sandboxId))).toEqual(new Set(leaks.keys()));
    // The reclaimed generations the database knew are marked released, bound to what was deleted.
    const { rows } = await database.t.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM sandbox_runtimes
       WHERE sandbox_id = ANY ($1::text[])
         AND NOT runtime_cleanup_generation_released(released_at, released_sandbox_id, released_generation, sandbox_id, generation)`,
      [[...leaks.keys()]],
    );
    expect(rows[0]!.n).toBe(0);
  });

  it('never deletes a sandbox younger than the grace (created a moment ago, not yet recorded)', async () => {
    const young = `sbx-young-${randomUUID().slice(0, 8)}`;
    await post(young);
    const first = await run();
    expect(first.leaked.map((sandbox) => sandbox.sandboxId)).toEqual([young]);
    expect(first.due).toEqual([]);
    await letTimePass(database.t.db, GRACE_SECONDS / 2);
    const second = await run();
    expect(second.due).toEqual([]);
    expect(provisioner.sandbox(young)).toBeDefined();
    expect(provisioner.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
  });
});

describe('a scope that becomes active between the listing and the DELETE wins', () => {
  beforeEach(async () => {
    await startLocal('platform');
  });

  async function dueLeak(): Promise<{ s: Scope; sandboxId: string }> {
    const s = await scope();
    const sandboxId = `sbx-${s.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: await post(sandboxId) });
    await runIn(s, 'completed');
    // Time passing: the scope idle and the leak seen for longer than the grace.
    await database.t.db.query(
      "UPDATE agent_runs SET created_at = now() - interval '1 hour', updated_at = now() - interval '1 hour', finished_at = now() - interval '1 hour' WHERE uid = $1::text",
      [s.uid],
    );
    const listing = await client.listSandboxes({ timeoutMs: 5_000 });
    await recordSightings(database.t.db, listing, {
      provisioner: provisionerIdentity(provisioner!.url),
      evidence: null,
    });
    await database.t.db.query(
      "UPDATE runtime_reclaim_sightings SET first_seen_at = now() - interval '1 hour'",
    );
    return { s, sandboxId };
  }

  it('an admission after the listing, before the guard: the guard refuses, nothing is sent', async () => {
    const { s, sandboxId } = await dueLeak();
    const {
      sandboxes: [classified],
    } = await classifyListing(database.t.db, await client.listSandboxes({ timeoutMs: 5_000 }), {
      graceSeconds: GRACE_SECONDS,
      provisioner: provisionerIdentity(provisioner!.url),
    });
    expect(classified!.waiting).toBeNull();
    const platform = new PlatformSimulator(database.t.db, {} as Queues, provisioner.url);
    const admitted = await platform.admitRootRun({ ...s, workdirPath: 'projects/x' });
    expect(admitted?.sandboxId).toBe(sandboxId);

    const event = await reclaimOne(
      { db: database.t.db, provider, provisioner: provisionerIdentity(provisioner!.url) },
      classified!,
      settings(),
    );

    expect(event).toMatchObject({ kind: 'skipped', verdict: ReclaimVerdict.SCOPE_ACTIVE });
    expect(provisioner.sandbox(sandboxId)).toBeDefined();
    expect(provisioner.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
  });

  it('an admission racing the DELETE is refused until the DELETE is answered, and a forced record of the id too', async () => {
    const { s, sandboxId } = await dueLeak();
    const {
      sandboxes: [classified],
    } = await classifyListing(database.t.db, await client.listSandboxes({ timeoutMs: 5_000 }), {
      graceSeconds: GRACE_SECONDS,
      provisioner: provisionerIdentity(provisioner!.url),
    });
    provisioner.setFault(sandboxId, { hang: true });
    const reclaiming = reclaimOne(
      { db: database.t.db, provider, provisioner: provisionerIdentity(provisioner!.url) },
      classified!,
      settings(),
    );
    // The DELETE is at the provisioner (hanging): the guard has recorded the delete in flight.
    await provisioner.waitForRequest(
      (entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId,
      10_000,
    );
    const platform = new PlatformSimulator(database.t.db, {} as Queues, provisioner.url);
    expect(await platform.admitRootRun({ ...s, workdirPath: 'projects/x' })).toBeUndefined();
    expect(await PlatformSimulator.isBlocked(database.t.db, s)).toBe(true);
    // A platform recording the id for another scope meanwhile is refused by the database.
    const other = await scope();
    const refused = await rejectionOf(upsertSandbox(database.t.db, { ...other, sandboxId, generation: 1 }));
    expect(String(refused)).toMatch(/is being reclaimed/);

    provisioner.clearFaults(sandboxId);
    expect(await reclaiming).toMatchObject({ kind: 'reclaimed' });
    expect(provisioner.sandbox(sandboxId)).toBeUndefined();
    // Answered: the scope is free again. The platform's listing gives no generation, so nothing
    // tells a fresh container of this id from the one just deleted (another scope deriving the
    // same id may have been handed it during the DELETE): its record waits out the attempt's hold
    // (the delete window plus margin), then the new run gets its new sandbox.
    expect(await PlatformSimulator.isBlocked(database.t.db, s)).toBe(false);
    const refusedRecord = await rejectionOf(platform.admitRootRun({ ...s, workdirPath: 'projects/x' }));
    expect((refusedRecord as { code?: string }).code).toBe('55006');
    await letTimePass(database.t.db, 15 + 5 + 5 + 10 + 1);
    await platform.acquireSandbox({ ...s, workdirPath: 'projects/x' });
    expect(provisioner.sandbox(sandboxId)).toBeDefined();
  });

  it('a pending fence raised after the listing: the guard refuses', async () => {
    const { s, sandboxId } = await dueLeak();
    const {
      sandboxes: [classified],
    } = await classifyListing(database.t.db, await client.listSandboxes({ timeoutMs: 5_000 }), {
      graceSeconds: GRACE_SECONDS,
      provisioner: provisionerIdentity(provisioner!.url),
    });
    await runIn(s, 'completed', true);
    const event = await reclaimOne(
      { db: database.t.db, provider, provisioner: provisionerIdentity(provisioner!.url) },
      classified!,
      settings(),
    );
    expect(event).toMatchObject({ kind: 'skipped', verdict: ReclaimVerdict.SCOPE_FENCED });
    expect(provisioner.sandbox(sandboxId)).toBeDefined();
  });
});

describe('bounds', () => {
  beforeEach(async () => {
    await startLocal('contract');
  });

  it('an empty database pointed at a full provisioner: refused (no known sandboxes), nothing recorded or deleted', async () => {
    for (let i = 0; i < 12; i += 1) await post(`sbx-fleet-${i}`);
    const error = await rejectionOf(run({ maxSharePercent: 50 }));
    expect(error).toBeInstanceOf(ReclaimRefusedError);
    expect((error as ReclaimRefusedError).reason).toBe(ReclaimRefusal.NO_KNOWN_SANDBOXES);
    expect((error as ReclaimRefusedError).message).toContain('none of the 12');
    const { rows } = await database.t.db.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM runtime_reclaim_sightings',
    );
    expect(rows[0]!.n).toBe(0);
    // Even with every streak long past the grace, the bound still holds.
    await database.t.db.query(
      "INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation, first_seen_at) SELECT 'sbx-fleet-' || i, 1, now() - interval '1 day' FROM generate_series(0, 11) i",
    );
    expect(((await rejectionOf(run({ maxSharePercent: 50 }))) as ReclaimRefusedError).reason).toBe(
      ReclaimRefusal.NO_KNOWN_SANDBOXES,
    );
    expect(provisioner.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
    expect((await client.listSandboxes({ timeoutMs: 5_000 })).length).toBe(12);
  });

  // A wrong DATABASE_URL, or a Neon branch restored to before those rows, makes every live sandbox
  // of a small fleet look unrecorded: no floor lets it through after the grace.
  it('a database that knows none of a small fleet deletes nothing, even after the grace', async () => {
    const ids = Array.from({ length: 9 }, (_, i) => `sbx-small-${i}`);
    for (const id of ids) await post(id);
    expect(((await rejectionOf(run({ maxSharePercent: 50 }))) as ReclaimRefusedError).reason).toBe(
      ReclaimRefusal.NO_KNOWN_SANDBOXES,
    );
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    expect(((await rejectionOf(run({ maxSharePercent: 50 }))) as ReclaimRefusedError).reason).toBe(
      ReclaimRefusal.NO_KNOWN_SANDBOXES,
    );
    expect(provisioner.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
  });

  it('a small fleet the database knows only one of: refused by the share rule, whatever its size', async () => {
    const s = await scope();
    const knownId = `sbx-${s.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...s, sandboxId: knownId, generation: await post(knownId) });
    await runIn(s, 'running');
    for (let i = 0; i < 4; i += 1) await post(`sbx-small-${i}`);
    const error = (await rejectionOf(run({ maxSharePercent: 50 }))) as ReclaimRefusedError;
    expect(error.reason).toBe(ReclaimRefusal.SHARE_EXCEEDED);
    expect(error.message).toContain('4 of 5');
    // One leak among them stays within the share: reclaimed after the grace.
    await fetch(new URL('/api/sandboxes/sbx-small-1', provisioner.url), { method: 'DELETE' });
    await fetch(new URL('/api/sandboxes/sbx-small-2', provisioner.url), { method: 'DELETE' });
    await fetch(new URL('/api/sandboxes/sbx-small-3', provisioner.url), { method: 'DELETE' });
    await eventually(
      'the three to be gone',
      async () => (await client.listSandboxes({ timeoutMs: 5_000 })).length === 2,
    );
    await run({ maxSharePercent: 50 });
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    expect((await run({ maxSharePercent: 50 })).reclaimed).toBe(1);
    expect(provisioner.sandbox('sbx-small-0')).toBeUndefined();
    expect(provisioner.sandbox(knownId)).toBeDefined();
  });

  it('deletes at most RECLAIM_MAX_PER_RUN per run, oldest streak first; the rest next run', async () => {
    for (let i = 0; i < 3; i += 1) await post(`sbx-leak-${i}`);
    await run({ maxPerRun: 2 });
    await database.t.db.query(
      'UPDATE runtime_reclaim_sightings SET first_seen_at = now() - make_interval(mins => 10 + substr(sandbox_id, 10)::int)',
    );
    const first = await run({ maxPerRun: 2 });
    expect(first.reclaimed).toBe(2);
    expect(first.deferred).toBe(1);
    expect(provisioner.sandbox('sbx-leak-2')).toBeUndefined();
    expect(provisioner.sandbox('sbx-leak-1')).toBeUndefined();
    expect(provisioner.sandbox('sbx-leak-0')).toBeDefined();
    const second = await run({ maxPerRun: 2 });
    expect(second.reclaimed).toBe(1);
    expect((await client.listSandboxes({ timeoutMs: 5_000 })).length).toBe(0);
  });
});
