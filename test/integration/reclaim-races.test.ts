/**
 * The reclaimer against the platform's own races and an operator's second reclaim, with real
 * PostgreSQL and the real local provisioner: a container the provisioner hands out again while a
 * reclaim deletes it is never recorded as live; two reclaims of one id never end each other's
 * quarantine; a reported reclaim is a deleted sandbox; a run never settles with a DELETE under way.
 */
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect, it } from 'vitest';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import type { TransactOptions } from '../../functions/cleanup/executor.ts';
import { DELETE_IN_FLIGHT_MARGIN_SECONDS } from '../../functions/cleanup/guarded-delete.ts';
import {
  provisionerIdentity,
  type ReclaimEvent,
  type ReclaimSettings,
  runReclaim,
} from '../../functions/cleanup/reclaim.ts';
import {
  beginReclaim,
  endReclaim,
  ReclaimEnding,
  ReclaimVerdict,
} from '../../functions/cleanup/reclaim-guard.ts';
import { SandboxProvider } from '../../functions/cleanup/sandbox-provider.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { insertConversation, insertRun, upsertSandbox } from '../support/factories.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf } from '../support/probes.ts';
import { letTimePass } from '../support/reclaim-time.ts';
import { eventually } from '../support/stack.ts';

const database = useDatabaseFixture();
const GRACE_SECONDS = 2;

let rootDir: string | undefined;
let provisioner: LocalProvisioner | undefined;
let client: ProvisionerClient | undefined;
let provider: SandboxProvider;

async function startLocal(mode: 'contract' | 'platform' = 'contract'): Promise<void> {
  rootDir = await mkdtemp(join(tmpdir(), 'rc-reclaim-races-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 300, mode });
  client = new ProvisionerClient(provisioner.url);
  provider = new SandboxProvider({ client, releaseLockTimeoutMs: 5_000, provisionerDeleteTimeoutMs: 5_000 });
}

afterEach(async () => {
  await client?.close();
  await provisioner?.stop();
  if (rootDir) await rm(rootDir, { recursive: true, force: true });
  client = undefined;
  provisioner = undefined;
  rootDir = undefined;
  await database.t.db.query('DELETE FROM runtime_reclaim_sightings');
  await database.t.db.query('DELETE FROM runtime_reclaim_tombstones');
});

function settings(overrides: Partial<ReclaimSettings> = {}): ReclaimSettings & { listTimeoutMs: number } {
  return {
    graceSeconds: GRACE_SECONDS,
    maxPerRun: 50,
    // These listings hold one or two sandboxes no row names: the share rules (reclaim.test.ts) off.
    maxSharePercent: 100,
    runtimeCleanupTimeoutMs: 15_000,
    provisionerDeleteTimeoutSeconds: 5,
    lockTimeoutMs: 5_000,
    listTimeoutMs: 5_000,
    ...overrides,
  };
}

function run(events: ReclaimEvent[] = [], overrides: Partial<ReclaimSettings> = {}) {
  return runReclaim(
    {
      db: database.t.db,
      provider,
      lister: client!,
      provisioner: provisionerIdentity(provisioner!.url),
      onEvent: (event) => events.push(event),
    },
    settings(overrides),
  );
}

/** The platform's acquisition: POST with the scope's own sandbox id (create, or the live one again). */
async function post(sandboxId: string): Promise<number> {
  const response = await fetch(new URL('/api/sandboxes', provisioner!.url), {
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

const live = (id: string) => provisioner!.liveSandboxes().some((sandbox) => sandbox.id === id);

// A leaked, unrecorded sandbox keeps its streak when the provisioner hands the very same live
// container to the scope's NEXT run (POST with the same id answers the live one). Between that POST
// and the platform's record no row names the id, so the guard has no scope to check and the DELETE
// may go out. The tombstone the confirmed reclaim leaves then refuses the record (55006), and the
// platform POSTs again for a fresh container, whose newer generation records.
it('a container handed out again between the POST and the record: its record is refused, or it is still live', async () => {
  await startLocal();
  const db = database.t.db;
  const s = await scope();
  const sandboxId = `sbx-${s.runtimeScopeId}`;
  // Run 1 created the sandbox and crashed before recording it.
  await insertRun(db, { ...s, status: 'interrupted' });
  await post(sandboxId);
  await run(); // first sighting
  await letTimePass(db, GRACE_SECONDS + 1);

  // Run 2 is admitted (no fence, no row) and its POST answers the live container again.
  await insertRun(db, { ...s, status: 'running' });
  const { rows } = await db.query<{ blocked: boolean }>('SELECT runtime_cleanup_blocked($1, $2) AS blocked', [
    s.uid,
    s.runtimeScopeId,
  ]);
  expect(rows[0]!.blocked).toBe(false);
  const generation = await post(sandboxId);

  // The scheduled reclaimer runs between the platform's POST and its record.
  const events: ReclaimEvent[] = [];
  await run(events);
  const error = await upsertSandbox(db, { ...s, sandboxId, generation }).then(
    () => null,
    (e: unknown) => e as { code?: string },
  );
  const kinds = JSON.stringify(events.map((event) => event.kind));
  expect(error?.code === '55006' || live(sandboxId), `events: ${kinds}`).toBe(true);
  expect(kinds).toBe('["reclaimed"]'); // the window is real: the DELETE went out

  // The platform's answer to 55006: POST again; the fresh, newer generation records and lives.
  const fresh = await post(sandboxId);
  expect(fresh).toBeGreaterThan(generation);
  await upsertSandbox(db, { ...s, sandboxId, generation: fresh });
  expect(live(sandboxId)).toBe(true);
});

it('a tombstone with no known generation refuses every record of the id until it expires, then lets it record', async () => {
  const db = database.t.db;
  const s = await scope();
  const sandboxId = `sbx-${s.runtimeScopeId}`;
  await db.query(
    `INSERT INTO runtime_reclaim_tombstones (sandbox_id, token, reclaimed_generation, refuse_all_until, expires_at)
     VALUES ($1, 'reclaim:test', NULL, clock_timestamp() + interval '1 second', clock_timestamp() + interval '1 second')`,
    [sandboxId],
  );
  const refused = await upsertSandbox(db, { ...s, sandboxId, generation: 7 }).then(
    () => null,
    (e: unknown) => e as { code?: string },
  );
  expect(refused?.code).toBe('55006');
  await letTimePass(db, 2);
  await upsertSandbox(db, { ...s, sandboxId, generation: 7 });
  const { rows } = await db.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM sandbox_runtimes WHERE sandbox_id = $1',
    [sandboxId],
  );
  expect(rows[0]!.n).toBe(1);
});

// Two reclaims of one unrecorded sandbox at once (the schedule and `ops reclaim --yes`, or two
// invocations): the second guard must not take over the first's quarantine, or its unconfirmed end
// (a 4xx, a refused connection) would clear it while the first DELETE may still act.
it('a second reclaim of the same id is refused while the first may act, and never clears its quarantine', async () => {
  const db = database.t.db;
  const sandboxId = `sbx-twice-${randomUUID().slice(0, 8)}`;
  await db.query(
    `INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation, first_seen_at, last_seen_at)
     VALUES ($1, NULL, now() - interval '1 hour', now())`,
    [sandboxId],
  );
  const options = { graceSeconds: GRACE_SECONDS, inFlightSeconds: 60, lockTimeoutMs: 5_000 };
  const target = { sandboxId, generation: 1, generationListed: false };
  const first = await beginReclaim(db, target, { ...options, token: 'reclaim:first' });
  expect(first.verdict).toBe(ReclaimVerdict.PROCEED);
  // The first DELETE is on the wire, unanswered. A second reclaimer arrives.
  const second = await beginReclaim(db, target, { ...options, token: 'reclaim:second' });
  expect(second.verdict).toBe(ReclaimVerdict.DELETE_IN_FLIGHT);
  // Even an end by the second token (answered 4xx) leaves the first's record.
  await endReclaim(db, target, 'reclaim:second', ReclaimEnding.ANSWERED);
  const s = await scope();
  const error = await upsertSandbox(db, { ...s, sandboxId, generation: 1 }).then(
    () => null,
    (e: unknown) => e as { code?: string },
  );
  expect(error?.code).toBe('55006');
  // The first one's answer ends it; then the id may be recorded.
  await endReclaim(db, target, 'reclaim:first', ReclaimEnding.ANSWERED);
  await upsertSandbox(db, { ...s, sandboxId, generation: 1 });
});

// A listing without generation makes the reclaimer name the DATABASE's generation. When the live
// container is a newer one nobody recorded, the generation-guarded DELETE answers 409 {newer}: that
// confirms only that the old generation is gone. Reporting it reclaimed would end the streak (and
// the persistent-leak alarm) while the container lives on.
it('a 409 naming a newer generation than the database records is not a reclaim: the sighting stays', async () => {
  await startLocal('contract');
  const db = database.t.db;
  const s = await scope();
  const sandboxId = `sbx-${s.runtimeScopeId}`;
  const first = await post(sandboxId);
  await upsertSandbox(db, { ...s, sandboxId, generation: first });
  await insertRun(db, { ...s, status: 'completed' });
  await db.query(
    `UPDATE sandbox_runtimes SET released_at = now(), released_sandbox_id = sandbox_id, released_generation = generation
     WHERE uid = $1 AND runtime_scope_id = $2`,
    [s.uid, s.runtimeScopeId],
  );
  // The next run of the scope replaced it under the same id and crashed before recording it.
  await fetch(new URL(`/api/sandboxes/${sandboxId}?generation=${first}`, provisioner!.url), {
    method: 'DELETE',
  });
  await eventually('the first generation to be gone', async () => !live(sandboxId));
  await insertRun(db, { ...s, status: 'interrupted' });
  const second = await post(sandboxId);
  expect(second).toBeGreaterThan(first);
  const lister = {
    listSandboxes: async (options: { timeoutMs: number }) =>
      (await client!.listSandboxes(options)).map((sandbox) => ({ ...sandbox, generation: null })),
  };
  const runWithout = (events: ReclaimEvent[] = []) =>
    runReclaim(
      {
        db,
        provider,
        lister,
        provisioner: provisionerIdentity(provisioner!.url),
        onEvent: (event) => events.push(event),
      },
      settings(),
    );
  await runWithout();
  await letTimePass(db, GRACE_SECONDS + 1);
  const events: ReclaimEvent[] = [];
  await runWithout(events);
  expect(events.map((event) => event.kind)).toEqual(['unconfirmed']);
  expect(live(sandboxId)).toBe(true);
  const { rows } = await db.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM runtime_reclaim_sightings WHERE sandbox_id = $1 AND reclaim_in_flight_until IS NULL',
    [sandboxId],
  );
  expect(rows[0]!.n).toBe(1);
});

// A database blip (Neon restarting the compute) at one sandbox's end-of-reclaim, after its DELETE
// was confirmed, must neither lose the run (the run settles only after every DELETE: a Lambda
// frozen with one pending, a CLI closing its client) nor leave the deleted container recordable:
// the guard laid its tombstone before the DELETE (issue 21, item 3).
it('a failed end-of-reclaim after a confirmed DELETE: reported, the run settles after every DELETE, and the deleted container stays unrecordable', async () => {
  await startLocal('contract');
  const db = database.t.db;
  const a = `sbx-a-${randomUUID().slice(0, 8)}`;
  const b = `sbx-b-${randomUUID().slice(0, 8)}`;
  const generationOfA = await post(a);
  await post(b);
  // A production-like grace, longer than the attempt's hold, so the two refusals can be told apart.
  const grace = { graceSeconds: 300 };
  await run([], grace); // both sighted
  await letTimePass(db, grace.graceSeconds + 1);
  // The end of the attempt is a one-statement transaction (Database.transact), like the guard.
  const flaky = {
    query: (text: string, params?: unknown[]) => db.query(text as never, params as never),
    transact: (text: string, params?: unknown[], options?: TransactOptions) => {
      if (text.includes('runtime_cleanup_end_reclaim') && params?.[1] === a) {
        return Promise.reject(
          Object.assign(new Error('Connection terminated unexpectedly'), { code: '57P01' }),
        );
      }
      return db.transact(text as never, params as never, options);
    },
  };
  let pending = 0;
  let bStarted: () => void = () => {};
  const aAnswered = new Promise<void>((resolve) => {
    bStarted = resolve;
  });
  const slowProvider = {
    release: async (ref: { sandboxId: string }, signal?: AbortSignal) => {
      pending += 1;
      try {
        // b's DELETE goes out only after a's end has failed.
        if (ref.sandboxId === b) await aAnswered;
        const result = await provider.release(ref as never, signal);
        if (ref.sandboxId === a) setTimeout(bStarted, 200);
        return result;
      } finally {
        pending -= 1;
      }
    },
  };
  const events: ReclaimEvent[] = [];
  const report = await runReclaim(
    {
      db: flaky as never,
      provider: slowProvider as never,
      lister: client!,
      provisioner: provisionerIdentity(provisioner!.url),
      onEvent: (e) => events.push(e),
    },
    settings(grace),
  );
  expect(pending).toBe(0);
  expect(Object.fromEntries(events.map((event) => [event.sandbox.sandboxId, event.kind]))).toEqual({
    [a]: 'reclaimed',
    [b]: 'reclaimed',
  });
  const eventOfA = events.find((event) => event.sandbox.sandboxId === a)!;
  expect(eventOfA.kind === 'reclaimed' && eventOfA.settleError).toBeTruthy();
  expect(report).toMatchObject({ reclaimed: 2, failed: 0 });
  expect(live(a) || live(b)).toBe(false);

  // The platform records a (a POST before the DELETE handed it out): refused, whatever happens to
  // the records' deadlines — during the hold any generation, after it the deleted one.
  const s = await scope();
  const during = await rejectionOf(upsertSandbox(db, { ...s, sandboxId: a, generation: generationOfA }));
  expect((during as { code?: string }).code).toBe('55006');
  await letTimePass(db, 60); // past every in-flight deadline of the attempt, within the grace
  const after = await rejectionOf(upsertSandbox(db, { ...s, sandboxId: a, generation: generationOfA }));
  expect((after as { code?: string }).code).toBe('55006');
  expect(String(after)).toMatch(/was reclaimed/);
  // A fresh container (a newer generation) records.
  await upsertSandbox(db, { ...s, sandboxId: a, generation: generationOfA + 1 });
});

// Without generations (the platform's listing), a leaked id removed by someone else (an idle
// reaper, an operator) and created again within one listing interval must not inherit the old
// streak: the listing's creation time differs, so the streak restarts and the fresh container,
// not yet recorded, waits a whole grace.
it('a container created again under a leaked id a moment ago is never reclaimed (listing without generation)', async () => {
  await startLocal('platform');
  const sandboxId = `sbx-again-${randomUUID().slice(0, 8)}`;
  await post(sandboxId);
  await run(); // first sighting
  await letTimePass(database.t.db, GRACE_SECONDS + 1);
  const removed = await fetch(new URL(`/api/sandboxes/${sandboxId}`, provisioner!.url), { method: 'DELETE' });
  expect(removed.status).toBeLessThan(300);
  await eventually('the removed container to be gone', async () => !live(sandboxId));
  await post(sandboxId);
  const events: ReclaimEvent[] = [];
  const report = await run(events); // the next listing, before the platform recorded it
  expect(events).toEqual([]);
  expect(report.due).toEqual([]);
  expect(live(sandboxId)).toBe(true);
  // The same container, still unrecorded a whole grace later, is reclaimed.
  await letTimePass(database.t.db, GRACE_SECONDS + 1);
  expect((await run()).reclaimed).toBe(1);
  expect(live(sandboxId)).toBe(false);
});

// A worker frozen between its guard and its DELETE (a Lambda environment frozen with the promise
// pending, thawed at a later invocation) must not send a DELETE that could act after its
// quarantine ended: the process clock jumping past the slack while the guard answers stands in for
// the freeze.
it('a DELETE whose quarantine could end before it is answered is never sent', async () => {
  await startLocal('contract');
  const db = database.t.db;
  const sandboxId = `sbx-frozen-${randomUUID().slice(0, 8)}`;
  await post(sandboxId);
  await run(); // first sighting
  await letTimePass(db, GRACE_SECONDS + 1);
  let frozenForMs = 0;
  const clock = () => Date.now() + frozenForMs;
  const frozen = {
    query: (text: string, params?: unknown[]) => db.query(text as never, params as never),
    transact: async (text: string, params?: unknown[], options?: TransactOptions) => {
      const answer = await db.transact(text as never, params as never, options);
      // Frozen for the guard's whole lock wait and the margin, and a moment more.
      if (text.includes('runtime_cleanup_begin_reclaim')) {
        frozenForMs = settings().lockTimeoutMs + (DELETE_IN_FLIGHT_MARGIN_SECONDS + 0.5) * 1000;
      }
      return answer;
    },
  };
  const events: ReclaimEvent[] = [];
  await runReclaim(
    {
      db: frozen as never,
      provider,
      lister: client!,
      provisioner: provisionerIdentity(provisioner!.url),
      onEvent: (event) => events.push(event),
      now: clock,
    },
    settings(),
  );
  expect(events.map((event) => event.kind)).toEqual(['unconfirmed']);
  expect(provisioner!.audit().filter((entry) => entry.method === 'DELETE')).toEqual([]);
  expect(live(sandboxId)).toBe(true);
  // Nothing was sent, so nothing can act: the attempt's quarantine and its tombstone ended at once.
  const { rows } = await db.query<{ sightings: number; tombstones: number }>(
    `SELECT (SELECT count(*)::int FROM runtime_reclaim_sightings WHERE sandbox_id = $1 AND reclaim_in_flight_until IS NULL) AS sightings,
            (SELECT count(*)::int FROM runtime_reclaim_tombstones WHERE sandbox_id = $1) AS tombstones`,
    [sandboxId],
  );
  expect(rows[0]).toEqual({ sightings: 1, tombstones: 0 });
});
