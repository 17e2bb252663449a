/**
 * The reclaimer held to the release path's safety (issue 21), against real PostgreSQL and the
 * real local provisioner, time passing as the database sees it (support/reclaim-time.ts):
 *
 * 1. whatever the database's, role's or pooled session's default isolation, a run admitted the
 *    documented way while the guard waits for the scope's lock keeps its sandbox;
 * 2. while the provisioner may still act on a reclaim DELETE (a 202, a 200 "deleting", a reset
 *    whose retry got a 4xx, a reset before a confirmed retry), the scope stays closed and the id
 *    unrecordable, for the residual window;
 * 4. the guard never applies weaker settings than the deployment recorded, whoever calls it;
 * 5. a NULL status counts as active, the released mark names its sandbox and generation;
 * 6. a quiet fleet's leaks are reclaimed within two listings after the grace, while a database
 *    paired with the wrong provisioner still deletes nothing;
 * 7. a conversation whose deterministic sandbox id was reclaimed gets a new sandbox within the
 *    delete window plus margin, not a grace later.
 * (Item 3, the tombstone laid before the DELETE, is in reclaim-races.test.ts.)
 */
import { createHash, randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { DATABASE_DRIVERS } from '../../functions/adapters/database-driver.ts';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { residualDeleteSeconds } from '../../functions/cleanup/guarded-delete.ts';
import {
  classifyListing,
  LeakReason,
  PAIRING_EVIDENCE_MAX_AGE_SECONDS,
  planReclaim,
  provisionerIdentity,
  type ReclaimEvent,
  type ReclaimSettings,
  reclaimOne,
  runReclaim,
  settingsOfRecord,
} from '../../functions/cleanup/reclaim.ts';
import { beginReclaim, ReclaimVerdict } from '../../functions/cleanup/reclaim-guard.ts';
import { ReclaimRefusal, type ReclaimRefusedError } from '../../functions/cleanup/reclaim-listing.ts';
import { beginRelease, endRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import type { Fault } from '../../infra/local/provisioner/faults.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { finishedRootRun, insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf, releaseNeeded } from '../support/probes.ts';
import { letTimePass } from '../support/reclaim-time.ts';
import { eventually } from '../support/stack.ts';

const database = useDatabaseFixture();
const GRACE_SECONDS = 60;

interface Local {
  provisioner: LocalProvisioner;
  client: ProvisionerClient;
  provider: SandboxProvider;
  rootDir: string;
}
const started: Local[] = [];

async function startLocal(mode: 'contract' | 'platform' = 'contract'): Promise<Local> {
  const rootDir = await mkdtemp(join(tmpdir(), 'rc-reclaim-safety-'));
  const provisioner = await startProvisioner({ rootDir, graceMs: 300, mode });
  const client = new ProvisionerClient(provisioner.url);
  const provider = new SandboxProvider({
    client,
    releaseLockTimeoutMs: 5_000,
    provisionerDeleteTimeoutMs: 5_000,
  });
  const local = { provisioner, client, provider, rootDir };
  started.push(local);
  return local;
}

afterEach(async () => {
  for (const local of started.splice(0)) {
    await local.client.close();
    await local.provisioner.stop();
    await rm(local.rootDir, { recursive: true, force: true });
  }
  await database.t.db.query(`
    DELETE FROM runtime_reclaim_sightings; DELETE FROM runtime_reclaim_tombstones;
    DELETE FROM runtime_reclaim_pairings; DELETE FROM runtime_cleanup_settings;`);
});

function settings(overrides: Partial<ReclaimSettings> = {}): ReclaimSettings & { listTimeoutMs: number } {
  return {
    graceSeconds: GRACE_SECONDS,
    maxPerRun: 50,
    maxSharePercent: 50,
    runtimeCleanupTimeoutMs: 15_000,
    provisionerDeleteTimeoutSeconds: 5,
    lockTimeoutMs: 5_000,
    listTimeoutMs: 5_000,
    ...overrides,
  };
}

function reclaim(
  local: Local,
  options: { db?: Database; events?: ReclaimEvent[]; overrides?: Partial<ReclaimSettings> } = {},
) {
  return runReclaim(
    {
      db: options.db ?? database.t.db,
      provider: local.provider,
      lister: local.client,
      provisioner: provisionerIdentity(local.provisioner.url),
      onEvent: (event) => options.events?.push(event),
    },
    settings(options.overrides),
  );
}

async function post(local: Local, sandboxId: string): Promise<number> {
  const response = await fetch(new URL('/api/sandboxes', local.provisioner.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 't', user_id: 'u' }),
  });
  const body = (await response.json()) as { generation?: number };
  return body.generation ?? 1;
}

async function scope() {
  const uid = `user-${randomUUID().slice(0, 8)}`;
  const conversation = await insertConversation(database.t.db, { uid });
  return {
    uid,
    runtimeScopeId: `scope-${randomUUID().slice(0, 8)}`,
    threadId: conversation.threadId,
    conversationId: conversation.id,
  };
}

type Scope = Awaited<ReturnType<typeof scope>>;

/**
 * A leak its scope still names (a forced clear whose DELETE was never sent): the scope's last run
 * completed, no fence, the sandbox live and recorded; sighted, and both a grace ago.
 */
async function dueOwnedLeak(local: Local): Promise<{ s: Scope; sandboxId: string; generation: number }> {
  const s = await scope();
  const sandboxId = `sbx-${s.runtimeScopeId}`;
  const generation = await post(local, sandboxId);
  await upsertSandbox(database.t.db, { ...s, sandboxId, generation });
  await insertRun(database.t.db, { ...s, status: 'completed' });
  await reclaim(local); // first sighting
  await letTimePass(database.t.db, GRACE_SECONDS + 1);
  return { s, sandboxId, generation };
}

const deletesAt = (local: Local, sandboxId: string) =>
  local.provisioner.audit().filter((entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId);

async function blocked(s: Pick<Scope, 'uid' | 'runtimeScopeId'>): Promise<boolean> {
  const { rows } = await database.t.db.query<{ blocked: boolean }>(
    'SELECT runtime_cleanup_blocked($1::text, $2::text) AS blocked',
    [s.uid, s.runtimeScopeId],
  );
  return rows[0]!.blocked;
}

describe('1. isolation: the guard reads what the platform committed while it waited for the lock', () => {
  /**
   * The platform admits a run exactly as the integration guide says (its transaction takes the
   * scope's advisory lock, checks runtime_cleanup_blocked, inserts the running run) and holds the
   * lock while the guard starts and waits for it; then commits. A guard whose snapshot was taken
   * before its lock was granted (REPEATABLE READ) would see the scope idle and delete.
   */
  async function admitWhileTheGuardWaits(local: Local, reclaimerDb: Database) {
    const { s, sandboxId } = await dueOwnedLeak(local);
    const {
      sandboxes: [classified],
    } = await classifyListing(database.t.db, await local.client.listSandboxes({ timeoutMs: 5_000 }), {
      graceSeconds: GRACE_SECONDS,
      provisioner: provisionerIdentity(local.provisioner.url),
    });
    expect(classified!.waiting).toBeNull();
    const admitter = await database.t.connect({ maxConnections: 1 });
    let lockHeld: () => void = () => {};
    const held = new Promise<void>((resolve) => {
      lockHeld = resolve;
    });
    let commit: () => void = () => {};
    const committing = new Promise<void>((resolve) => {
      commit = resolve;
    });
    const admission = admitter.withTransaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
        s.uid,
        s.runtimeScopeId,
      ]);
      await tx.query(
        `INSERT INTO agent_runs (id, uid, conversation_id, conversation_thread_id, runtime_scope_id, status)
         SELECT $1::text, $2::text, $3::bigint, $4::text, $5::text, 'running'
         WHERE NOT runtime_cleanup_blocked($2::text, $5::text)`,
        [`run-${randomUUID()}`, s.uid, s.conversationId, s.threadId, s.runtimeScopeId],
      );
      lockHeld();
      await committing;
    });
    await held;
    const reclaiming = reclaimOne(
      { db: reclaimerDb, provider: local.provider, provisioner: provisionerIdentity(local.provisioner.url) },
      classified!,
      settings(),
    );
    await eventually('the guard to wait for the scope lock', async () => {
      const { rows } = await database.t.db.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
      );
      return rows[0]!.n > 0;
    });
    commit();
    await admission;
    const event = await reclaiming;
    await admitter.end();
    return { event, sandboxId };
  }

  it('with the database default REPEATABLE READ: the guard answers scope_active, no DELETE', async () => {
    const local = await startLocal();
    await database.t.setDefaultIsolation('repeatable read');
    try {
      const reclaimerDb = await database.t.connect({ maxConnections: 1, direct: true });
      const { rows } = await reclaimerDb.query<{ level: string }>(
        "SELECT current_setting('default_transaction_isolation') AS level",
      );
      expect(rows[0]!.level).toBe('repeatable read');
      const { event, sandboxId } = await admitWhileTheGuardWaits(local, reclaimerDb);
      expect(event).toMatchObject({ kind: 'skipped', verdict: ReclaimVerdict.SCOPE_ACTIVE });
      expect(deletesAt(local, sandboxId)).toEqual([]);
      expect(local.provisioner.sandbox(sandboxId)).toBeDefined();
      await reclaimerDb.end();
    } finally {
      await database.t.setDefaultIsolation(null);
    }
  });

  it('with the database default REPEATABLE READ, a due leak of an idle scope is still reclaimed and its bookkeeping written', async () => {
    // Contract: the database's default isolation does not matter. Every statement of the run (the
    // sightings, the guard, the DELETE's ending) must work under it, not only refuse rightly.
    const local = await startLocal();
    const { s, sandboxId, generation } = await dueOwnedLeak(local);
    await database.t.setDefaultIsolation('repeatable read');
    try {
      const reclaimerDb = await database.t.connect({ maxConnections: 1, direct: true });
      const events: ReclaimEvent[] = [];
      await reclaim(local, { db: reclaimerDb, events });
      await reclaimerDb.end();
      expect(events.map((event) => event.kind)).toEqual(['reclaimed']);
      expect(local.provisioner.sandbox(sandboxId)).toBeUndefined();
      const { rows } = await database.t.db.query<{
        released_sandbox_id: string;
        released_generation: string;
      }>(
        'SELECT released_sandbox_id, released_generation FROM sandbox_runtimes WHERE uid = $1 AND runtime_scope_id = $2',
        [s.uid, s.runtimeScopeId],
      );
      expect(rows).toEqual([{ released_sandbox_id: sandboxId, released_generation: String(generation) }]);
    } finally {
      await database.t.setDefaultIsolation(null);
    }
  });

  it('with SERIALIZABLE left behind on a pooled session: the same', async () => {
    const local = await startLocal();
    const reclaimerDb = await database.t.connect({ maxConnections: 1, direct: true });
    await reclaimerDb.query("SET SESSION default_transaction_isolation = 'serializable'");
    const { event, sandboxId } = await admitWhileTheGuardWaits(local, reclaimerDb);
    expect(event).toMatchObject({ kind: 'skipped', verdict: ReclaimVerdict.SCOPE_ACTIVE });
    expect(deletesAt(local, sandboxId)).toEqual([]);
    await reclaimerDb.end();
  });

  it('the guard itself refuses to decide outside READ COMMITTED, whoever calls it', async () => {
    const rr = await database.t.connect({ maxConnections: 1, direct: true });
    await rr.query("SET SESSION default_transaction_isolation = 'repeatable read'");
    const error = await rejectionOf(
      rr.query("SELECT * FROM runtime_cleanup_begin_reclaim('sbx-x', 1, true, 60, 60, 'reclaim:t', 1000)"),
    );
    expect(String(error)).toMatch(/READ COMMITTED/);
    await rr.end();
  });
});

describe('2. while a reclaim DELETE may still act, the scope stays closed and the id unrecordable', () => {
  const RESIDUAL_SECONDS = residualDeleteSeconds(settings().provisionerDeleteTimeoutSeconds);

  async function quarantine(s: Scope, sandboxId: string) {
    const { rows } = await database.t.db.query<{ until_in: number | null; refused_for: number | null }>(
      `SELECT extract(epoch FROM (SELECT max(delete_in_flight_until) FROM sandbox_runtimes
                                  WHERE uid = $1 AND runtime_scope_id = $2) - clock_timestamp())::float8 AS until_in,
              extract(epoch FROM (SELECT max(refuse_all_until) FROM runtime_reclaim_tombstones
                                  WHERE sandbox_id = $3) - clock_timestamp())::float8 AS refused_for`,
      [s.uid, s.runtimeScopeId, sandboxId],
    );
    return rows[0]!;
  }

  it.each<[string, Fault[]]>([
    [
      'a 202 (accepted, not done yet)',
      [{ status: 202, body: '{"status":"deleting"}', contentType: 'application/json' }],
    ],
    [
      'a 200 whose body says "deleting"',
      [{ status: 200, body: '{"status":"deleting"}', contentType: 'application/json' }],
    ],
    [
      'a 200 whose status is the number 202',
      [{ status: 200, body: '{"status":202}', contentType: 'application/json' }],
    ],
    [
      'a 200 wrapping "deleting" in data',
      [{ status: 200, body: '{"data":{"status":"deleting"}}', contentType: 'application/json' }],
    ],
    [
      'a reset after the request may have been written, whose immediate retry got a 4xx',
      [
        { reset: true, times: 1 },
        { status: 400, body: '{"error":"bad request"}', contentType: 'application/json', times: 1 },
      ],
    ],
  ])('%s: failed, quarantined for the residual window, then open', async (_name, faults) => {
    const local = await startLocal();
    const { s, sandboxId } = await dueOwnedLeak(local);
    for (const fault of faults) local.provisioner.setFault(sandboxId, fault);
    const events: ReclaimEvent[] = [];
    await reclaim(local, { events });
    expect(events.map((event) => event.kind)).toEqual(['failed']);
    expect(events[0]).toMatchObject({ quarantined: true });
    expect(await blocked(s)).toBe(true);
    const { until_in, refused_for } = await quarantine(s, sandboxId);
    expect(until_in).toBeGreaterThan(RESIDUAL_SECONDS - 3);
    expect(until_in).toBeLessThanOrEqual(RESIDUAL_SECONDS + 1);
    expect(refused_for).toBeGreaterThan(RESIDUAL_SECONDS - 3);
    // The platform recording the id meanwhile is refused.
    const other = await scope();
    const refused = await rejectionOf(upsertSandbox(database.t.db, { ...other, sandboxId, generation: 99 }));
    expect((refused as { code?: string }).code).toBe('55006');
    await letTimePass(database.t.db, RESIDUAL_SECONDS + 1);
    expect(await blocked(s)).toBe(false);
  });

  it('a reset before a confirmed retry: reclaimed, and still quarantined for the residual window', async () => {
    const local = await startLocal();
    const { s, sandboxId } = await dueOwnedLeak(local);
    // The first DELETE is carried out but its answer lost; the retry hears 404.
    local.provisioner.setFault(sandboxId, { reset: true, afterHandling: true, times: 1 });
    const events: ReclaimEvent[] = [];
    await reclaim(local, { events });
    expect(events.map((event) => event.kind)).toEqual(['reclaimed']);
    expect(local.provisioner.sandbox(sandboxId)).toBeUndefined();
    expect(await blocked(s)).toBe(true);
    expect((await quarantine(s, sandboxId)).until_in).toBeLessThanOrEqual(RESIDUAL_SECONDS + 1);
    await letTimePass(database.t.db, RESIDUAL_SECONDS + 1);
    expect(await blocked(s)).toBe(false);
  });

  it('an answer that settles it (a 403) ends the quarantine at once', async () => {
    const local = await startLocal();
    const { s, sandboxId } = await dueOwnedLeak(local);
    local.provisioner.setFault(sandboxId, {
      status: 403,
      body: '{"error":"no"}',
      contentType: 'application/json',
    });
    const events: ReclaimEvent[] = [];
    await reclaim(local, { events });
    expect(events).toMatchObject([{ kind: 'failed', quarantined: false }]);
    expect(await blocked(s)).toBe(false);
    const { rows } = await database.t.db.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM runtime_reclaim_tombstones WHERE sandbox_id = $1',
      [sandboxId],
    );
    expect(rows[0]!.n).toBe(0);
  });
});

describe("4. settings of record: nobody's guard is weaker than the deployment's", () => {
  it('an operator run with a shorter grace applies the recorded one, in its own plan and in the guard', async () => {
    const local = await startLocal();
    // The deployment's reclaimer runs with a grace of an hour and records it.
    await settingsOfRecord(database.t.db, { ...settings({ graceSeconds: 3600 }), recordAs: 'reclaimer' });
    const s = await scope();
    const sandboxId = `sbx-${s.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: await post(local, sandboxId) });
    await insertRun(database.t.db, { ...s, status: 'completed' });
    await reclaim(local, { overrides: { graceSeconds: 2 } });
    await letTimePass(database.t.db, 120);
    // An operator's shell with the default-looking grace of 2 s: not due, and says why.
    const report = await reclaim(local, { overrides: { graceSeconds: 2 } });
    expect(report.reclaimed).toBe(0);
    expect(report.settings.tightened).toContain('reclaim_grace_seconds');
    expect(report.settings.effective.graceSeconds).toBe(3600);
    expect(local.provisioner.sandbox(sandboxId)).toBeDefined();
    // The guard enforces it whatever a caller passes.
    const guard = await beginReclaim(
      database.t.db,
      { sandboxId, generation: 1, generationListed: true },
      { graceSeconds: 2, inFlightSeconds: 1, lockTimeoutMs: 1_000, token: 'reclaim:operator' },
    );
    expect(guard.verdict).toBe(ReclaimVerdict.NOT_SIGHTED);
    // An hour on, it proceeds, with the deployment's hold, not the 1 s it was passed.
    await letTimePass(database.t.db, 3600);
    const later = await beginReclaim(
      database.t.db,
      { sandboxId, generation: 1, generationListed: true },
      { graceSeconds: 2, inFlightSeconds: 1, lockTimeoutMs: 1_000, token: 'reclaim:operator-2' },
    );
    expect(later).toMatchObject({ verdict: ReclaimVerdict.PROCEED, graceSeconds: 3600 });
    expect(later.verdict === ReclaimVerdict.PROCEED && later.holdSeconds).toBeGreaterThan(30);
  });
});

describe("4b. settings of record: nobody's brakes are looser than the deployment's", () => {
  it('an operator run with RECLAIM_MAX_SHARE_PERCENT=100 in its shell is refused where the deployment (50 %) is', async () => {
    const local = await startLocal();
    await settingsOfRecord(database.t.db, { ...settings({ maxPerRun: 3 }), recordAs: 'reclaimer' });
    // A fleet this database knows nothing of (the wrong provisioner, or the wrong database).
    for (const name of ['a', 'b', 'c', 'd', 'e'])
      await post(local, `sbx-foreign-${name}-${randomUUID().slice(0, 6)}`);
    const shell = { maxSharePercent: 100, maxPerRun: 1000 };
    expect(((await rejectionOf(reclaim(local, { overrides: shell }))) as ReclaimRefusedError).reason).toBe(
      ReclaimRefusal.NO_KNOWN_SANDBOXES,
    );
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    expect(((await rejectionOf(reclaim(local, { overrides: shell }))) as ReclaimRefusedError).reason).toBe(
      ReclaimRefusal.NO_KNOWN_SANDBOXES,
    );
    expect(local.provisioner.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
  });

  it('the per-run bound is the smaller of the two', async () => {
    const local = await startLocal();
    await settingsOfRecord(database.t.db, {
      ...settings({ maxPerRun: 2, maxSharePercent: 100 }),
      recordAs: 'reclaimer',
    });
    for (let i = 0; i < 4; i += 1) await post(local, `sbx-many-${i}-${randomUUID().slice(0, 6)}`);
    const shell = { maxSharePercent: 100, maxPerRun: 1000 };
    await reclaim(local, { overrides: shell });
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    const report = await reclaim(local, { overrides: shell });
    expect(report).toMatchObject({ reclaimed: 2, deferred: 2 });
    expect(report.settings.tightened).toEqual(expect.arrayContaining(['reclaim_max_per_run']));
  });
});

describe('4c. settings of record that are not finite numbers', () => {
  it('the recording function refuses NaN and Infinity', async () => {
    for (const value of ['NaN', 'Infinity']) {
      const refused = await rejectionOf(
        database.t.db.transact(
          "SELECT * FROM runtime_cleanup_settings_of_record(jsonb_build_object('reclaim_max_share_percent', $1::text), 'hand')",
          [value],
        ),
      );
      expect(String(refused)).toMatch(/must be a finite number/);
    }
  });

  it('a NaN share written by hand stops the run with an error naming it, instead of switching the brake off', async () => {
    const local = await startLocal();
    await database.t.db.transact(
      `INSERT INTO runtime_cleanup_settings (name, value, recorded_at, recorded_by)
       VALUES ('reclaim_max_share_percent', 'NaN', now(), 'hand')
       ON CONFLICT (name) DO UPDATE SET value = 'NaN', recorded_at = now(), recorded_by = 'hand'`,
    );
    for (const name of ['a', 'b', 'c']) await post(local, `sbx-nan-${name}-${randomUUID().slice(0, 6)}`);
    const refused = await rejectionOf(reclaim(local, { overrides: { maxSharePercent: 100 } }));
    expect(String(refused)).toMatch(/reclaim_max_share_percent is NaN, not a finite number/);
    expect(local.provisioner.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
    await database.t.db.transact("DELETE FROM runtime_cleanup_settings WHERE recorded_by = 'hand'");
  });
});

describe('5. the same rules as the phases', () => {
  it('a run whose status is NULL holds its scope: the guard refuses', async () => {
    const local = await startLocal();
    const { s, sandboxId } = await dueOwnedLeak(local);
    const {
      sandboxes: [classified],
    } = await classifyListing(database.t.db, await local.client.listSandboxes({ timeoutMs: 5_000 }), {
      graceSeconds: GRACE_SECONDS,
      provisioner: provisionerIdentity(local.provisioner.url),
    });
    await database.t.db.query('ALTER TABLE agent_runs ALTER COLUMN status DROP NOT NULL');
    try {
      await insertRun(database.t.db, { ...s, status: null as never });
      const event = await reclaimOne(
        {
          db: database.t.db,
          provider: local.provider,
          provisioner: provisionerIdentity(local.provisioner.url),
        },
        classified!,
        settings(),
      );
      expect(event).toMatchObject({ kind: 'skipped', verdict: ReclaimVerdict.SCOPE_ACTIVE });
      expect(deletesAt(local, sandboxId)).toEqual([]);
    } finally {
      await database.t.db.query('DELETE FROM agent_runs WHERE status IS NULL');
      await database.t.db.query('ALTER TABLE agent_runs ALTER COLUMN status SET NOT NULL');
    }
  });

  it('a reclaimed generation is marked released with its sandbox id and generation, as finalize marks it', async () => {
    const local = await startLocal();
    const { s, sandboxId, generation } = await dueOwnedLeak(local);
    expect((await reclaim(local)).reclaimed).toBe(1);
    const { rows } = await database.t.db.query(
      `SELECT released_sandbox_id, released_generation::int AS released_generation,
              runtime_cleanup_generation_released(released_at, released_sandbox_id, released_generation, sandbox_id, generation) AS released
       FROM sandbox_runtimes WHERE uid = $1 AND runtime_scope_id = $2`,
      [s.uid, s.runtimeScopeId],
    );
    expect(rows[0]).toEqual({
      released_sandbox_id: sandboxId,
      released_generation: generation,
      released: true,
    });
  });

  it('a NULL-status run quiet for longer than the grace still holds its scope: no DELETE', async () => {
    const local = await startLocal();
    const s = await scope();
    const sandboxId = `sbx-${s.runtimeScopeId}`;
    const generation = await post(local, sandboxId);
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation });
    await insertRun(database.t.db, { ...s, status: 'completed' });
    await reclaim(local);
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    const {
      sandboxes: [classified],
    } = await classifyListing(database.t.db, await local.client.listSandboxes({ timeoutMs: 5_000 }), {
      graceSeconds: GRACE_SECONDS,
      provisioner: provisionerIdentity(local.provisioner.url),
    });
    await database.t.db.query('ALTER TABLE agent_runs ALTER COLUMN status DROP NOT NULL');
    try {
      await insertRun(database.t.db, { ...s, status: null as never });
      // The run's status was never written and it has been quiet for longer than the grace.
      await letTimePass(database.t.db, GRACE_SECONDS + 1);
      const event = await reclaimOne(
        {
          db: database.t.db,
          provider: local.provider,
          provisioner: provisionerIdentity(local.provisioner.url),
        },
        classified!,
        settings(),
      );
      expect(deletesAt(local, sandboxId)).toEqual([]);
      expect(event).toMatchObject({ kind: 'skipped', verdict: ReclaimVerdict.SCOPE_ACTIVE });
    } finally {
      await database.t.db.query('DELETE FROM agent_runs WHERE status IS NULL');
      await database.t.db.query('ALTER TABLE agent_runs ALTER COLUMN status SET NOT NULL');
    }
  });

  it("a live new generation whose stale release mark survived a trigger-bypassing write is 'cleanup never ran', not 'kept after release'", async () => {
    const s = await scope();
    const sandboxId = `sbx-${s.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 });
    await database.t.db.query(
      `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
       WHERE uid = $1::text AND runtime_scope_id = $2::text`,
      [s.uid, s.runtimeScopeId],
    );
    // A restore under session_replication_role = replica records generation 2 without the trigger.
    await database.t.db.withTransaction(async (tx) => {
      await tx.query('SET LOCAL session_replication_role = replica');
      await tx.query(
        'UPDATE sandbox_runtimes SET generation = 2 WHERE uid = $1::text AND runtime_scope_id = $2::text',
        [s.uid, s.runtimeScopeId],
      );
    });
    await insertRun(database.t.db, { ...s, status: 'completed' });
    const {
      sandboxes: [classified],
    } = await classifyListing(
      database.t.db,
      [{ sandboxId, generation: 2, status: 'running', identity: null }],
      { graceSeconds: GRACE_SECONDS, provisioner: 'http://unused' },
    );
    expect(classified!.owners[0]!.released).toBe(false);
    expect(classified!.reason).toBe(LeakReason.CLEANUP_NEVER_RAN);
  });
});

describe('6. a quiet fleet is reclaimed; a wrong pairing still is not', () => {
  it('at night every run has ended and only leaks are live: reclaimed within two listings after the grace', async () => {
    const local = await startLocal();
    // Daytime: a live run's sandbox is listed beside one leak; a healthy listing vouches for the pairing.
    const day = await scope();
    const dayId = `sbx-${day.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...day, sandboxId: dayId, generation: await post(local, dayId) });
    await insertRun(database.t.db, { ...day, status: 'running' });
    await reclaim(local);
    // Evening: the run ends and is cleaned up; three admissions crash between POST and record.
    await database.t.db.query("UPDATE agent_runs SET status = 'completed' WHERE uid = $1", [day.uid]);
    await fetch(new URL(`/api/sandboxes/${dayId}`, local.provisioner.url), { method: 'DELETE' });
    await eventually('the day sandbox to be gone', async () => !local.provisioner.sandbox(dayId));
    const leaks = ['a', 'b', 'c'].map((name) => `sbx-night-${name}-${randomUUID().slice(0, 6)}`);
    for (const id of leaks) await post(local, id);
    await letTimePass(database.t.db, 10 * 3600); // a long, quiet night
    // Both brakes would refuse these listings on their own: none is known, all are leaked.
    const first = await reclaim(local);
    expect(first.brakeLifted).toMatchObject({ brake: ReclaimRefusal.NO_KNOWN_SANDBOXES });
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    const second = await reclaim(local);
    expect(second.reclaimed).toBe(3);
    for (const id of leaks) expect(local.provisioner.sandbox(id)).toBeUndefined();
  });

  it("another provisioner's fleet, unknown to this database: refused on every listing, nothing deleted", async () => {
    const ours = await startLocal();
    const day = await scope();
    const dayId = `sbx-${day.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...day, sandboxId: dayId, generation: await post(ours, dayId) });
    await insertRun(database.t.db, { ...day, status: 'running' });
    await reclaim(ours); // this database's pairing with OUR provisioner is confirmed
    const foreign = await startLocal();
    for (let i = 0; i < 5; i += 1) await post(foreign, `sbx-foreign-${i}`);
    for (let pass = 0; pass < 3; pass += 1) {
      const error = await rejectionOf(reclaim(foreign));
      expect((error as ReclaimRefusedError).reason).toBe(ReclaimRefusal.NO_KNOWN_SANDBOXES);
      await letTimePass(database.t.db, GRACE_SECONDS + 1);
    }
    expect(foreign.provisioner.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
  });

  it('evidence older than the pairing window vouches for nothing', async () => {
    const local = await startLocal();
    const day = await scope();
    const dayId = `sbx-${day.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...day, sandboxId: dayId, generation: await post(local, dayId) });
    await insertRun(database.t.db, { ...day, status: 'running' });
    await reclaim(local);
    await database.t.db.query("UPDATE agent_runs SET status = 'completed' WHERE uid = $1", [day.uid]);
    await fetch(new URL(`/api/sandboxes/${dayId}`, local.provisioner.url), { method: 'DELETE' });
    await eventually('the day sandbox to be gone', async () => !local.provisioner.sandbox(dayId));
    await post(local, `sbx-late-${randomUUID().slice(0, 6)}`);
    await letTimePass(database.t.db, PAIRING_EVIDENCE_MAX_AGE_SECONDS + 60);
    const error = await rejectionOf(reclaim(local));
    expect((error as ReclaimRefusedError).reason).toBe(ReclaimRefusal.NO_KNOWN_SANDBOXES);
    expect((error as ReclaimRefusedError).message).toMatch(/longer ago than/);
  });
});

describe.each(['SQL, DMY', 'German'] as const)("6b. a database whose DateStyle is '%s'", (style) => {
  // Set on the database, as a team might: every session logs in with it unless it says otherwise.
  beforeEach(() => database.t.setDateStyle(style));
  afterEach(() => database.t.setDateStyle(null));

  it.each(DATABASE_DRIVERS)(
    "over the %s driver: a quiet fleet is reclaimed as under ISO, in streak order, and a release guard's residual deadline is a date",
    async (driver) => {
      const db = await database.t.connect({ driver, maxConnections: 4 });
      // The setting is in place: a session that does not say otherwise logs in with it.
      const { rows } = await db.query<{ config: string[] }>(
        `SELECT setconfig AS config FROM pg_db_role_setting
         WHERE setrole = 0 AND setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      );
      expect(rows[0]?.config).toContain(`DateStyle=${style}`);
      const local = await startLocal();
      // The quiet fleet of section 6: a healthy listing by day, only leaks by night.
      const day = await scope();
      const dayId = `sbx-${day.runtimeScopeId}`;
      await upsertSandbox(database.t.db, { ...day, sandboxId: dayId, generation: await post(local, dayId) });
      await insertRun(database.t.db, { ...day, status: 'running' });
      await reclaim(local, { db });
      await database.t.db.query("UPDATE agent_runs SET status = 'completed' WHERE uid = $1", [day.uid]);
      await fetch(new URL(`/api/sandboxes/${dayId}`, local.provisioner.url), { method: 'DELETE' });
      await eventually('the day sandbox to be gone', async () => !local.provisioner.sandbox(dayId));
      const leaks = ['a', 'b'].map((name) => `sbx-night-${name}-${randomUUID().slice(0, 6)}`);
      for (const id of leaks) await post(local, id);
      await letTimePass(database.t.db, 10 * 3600);
      const first = await reclaim(local, { db });
      expect(first.brakeLifted).toMatchObject({ brake: ReclaimRefusal.NO_KNOWN_SANDBOXES });
      await letTimePass(database.t.db, GRACE_SECONDS + 1);
      const second = await reclaim(local, { db });
      expect(second.reclaimed).toBe(2);
      for (const sandbox of second.due) expect(sandbox.firstSeenAt).toBeInstanceOf(Date);
      for (const id of leaks) expect(local.provisioner.sandbox(id)).toBeUndefined();

      // The release guard's residual deadline, read back by a plain statement.
      const s = await finishedRootRun(database.t.db);
      const identity = releaseNeeded(await fenceCheck(db, s.rootRunId));
      const guard = await beginRelease(
        db,
        { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
        { inFlightSeconds: 600, lockTimeoutMs: 5_000 },
      );
      if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(guard.verdict);
      const until = await endRelease(db, guard.inFlight, 30);
      expect(until).toBeInstanceOf(Date);
      const inSeconds = ((until as Date).getTime() - Date.now()) / 1000;
      expect(inSeconds).toBeGreaterThan(25);
      expect(inSeconds).toBeLessThanOrEqual(31);
    },
  );
});

describe('6c. a streak start that reads as missing', () => {
  it('stops the plan with an error naming the sandbox, not a TypeError inside the sort', async () => {
    const local = await startLocal();
    const day = await scope();
    const dayId = `sbx-${day.runtimeScopeId}`;
    await upsertSandbox(database.t.db, { ...day, sandboxId: dayId, generation: await post(local, dayId) });
    await insertRun(database.t.db, { ...day, status: 'running' });
    for (const name of ['a', 'b']) await post(local, `sbx-due-${name}-${randomUUID().slice(0, 6)}`);
    await reclaim(local); // first sightings
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    const listing = await local.client.listSandboxes({ timeoutMs: 5_000 });
    // A reader the pinned session settings do not reach (SET LOCAL inside its own transaction): the
    // driver reads every timestamp it renders as null, so two due leaks have no streak start.
    const error = await rejectionOf(
      database.t.db.withTransaction(async (tx) => {
        await tx.query("SET LOCAL DateStyle = 'SQL, DMY'");
        return planReclaim(
          tx,
          listing,
          settings({ maxSharePercent: 100 }),
          provisionerIdentity(local.provisioner.url),
        );
      }),
    );
    expect(error).not.toBeInstanceOf(TypeError);
    expect(String((error as Error).message)).toMatch(
      /the due sandbox sbx-due-\S+ has no readable streak start/,
    );
  });
});

describe('7. deterministic sandbox ids and a provisioner without generations', () => {
  /** The platform's own rule: the sandbox id is derived from the conversation. */
  const idOf = (threadId: string) => createHash('sha256').update(threadId).digest('hex').slice(0, 12);

  /** The attempt's hold: its bound, the guard's lock wait, the provisioner's delete time, the margin. */
  const HOLD_SECONDS = 15 + 5 + 5 + 10;

  it("the conversation's recorded sandbox, reclaimed: its next container records after the delete window, not a grace later", async () => {
    const local = await startLocal('platform');
    const s = await scope();
    const sandboxId = idOf(s.threadId);
    await post(local, sandboxId);
    // The platform records its own counter as the generation (the provisioner reports none).
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 });
    await insertRun(database.t.db, { ...s, status: 'completed' });
    const grace = { graceSeconds: 3600 };
    await reclaim(local, { overrides: grace });
    await letTimePass(database.t.db, grace.graceSeconds + 1);
    expect((await reclaim(local, { overrides: grace })).reclaimed).toBe(1);
    // The next run of the conversation: POST (a fresh container, same id) and record. Within the
    // delete window nothing tells it from the container just deleted: refused.
    await post(local, sandboxId);
    const refused = await rejectionOf(upsertSandbox(database.t.db, { ...s, sandboxId, generation: 2 }));
    expect((refused as { code?: string }).code).toBe('55006');
    await letTimePass(database.t.db, HOLD_SECONDS + 1);
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 2 });
    // Even a sloppy platform that records 1 again is not locked out for the grace.
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 });
  });

  it('another scope of the conversation, handed the container during the DELETE, cannot record it after the confirmation', async () => {
    const local = await startLocal('platform');
    const s = await scope();
    const sandboxId = idOf(s.threadId);
    await post(local, sandboxId);
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 });
    await insertRun(database.t.db, { ...s, status: 'completed' });
    await reclaim(local);
    await letTimePass(database.t.db, GRACE_SECONDS + 1);
    // Scope B of the same conversation (no row yet, so not blocked) POSTs while the DELETE hangs:
    // the provisioner hands it the live container, the one being deleted.
    local.provisioner.setFault(sandboxId, { latencyMs: 300, times: 1 });
    const reclaiming = reclaim(local);
    await local.provisioner.waitForRequest(
      (entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId,
      10_000,
    );
    await post(local, sandboxId);
    expect((await reclaiming).reclaimed).toBe(1);
    expect(local.provisioner.sandbox(sandboxId)).toBeUndefined();
    const b = { ...s, runtimeScopeId: `scope-b-${randomUUID().slice(0, 6)}` };
    const refused = await rejectionOf(upsertSandbox(database.t.db, { ...b, sandboxId, generation: 1 }));
    expect((refused as { code?: string }).code).toBe('55006');
  });

  it('an unrecorded container of the conversation, reclaimed: its next one records after the delete window, not a grace later', async () => {
    const local = await startLocal('platform');
    const s = await scope();
    const sandboxId = idOf(s.threadId);
    // The conversation's first admission crashed between POST and record.
    await insertRun(database.t.db, { ...s, status: 'interrupted' });
    await post(local, sandboxId);
    const grace = { graceSeconds: 3600 };
    await reclaim(local, { overrides: { ...grace, maxSharePercent: 100 } });
    await letTimePass(database.t.db, grace.graceSeconds + 1);
    expect((await reclaim(local, { overrides: { ...grace, maxSharePercent: 100 } })).reclaimed).toBe(1);
    await post(local, sandboxId);
    // Within the delete window a record of the id may name the container just deleted: refused.
    const refused = await rejectionOf(upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 }));
    expect((refused as { code?: string }).code).toBe('55006');
    // The window is the attempt's hold, far below the grace.
    await letTimePass(database.t.db, HOLD_SECONDS + 1);
    await upsertSandbox(database.t.db, { ...s, sandboxId, generation: 1 });
  });
});
