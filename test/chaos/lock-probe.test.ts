/**
 * Invariant 3's probe, against a deliberately broken "cleanup": a connection that carries the
 * stack's application name and holds the scope's advisory lock and the run's row lock while a
 * provisioner DELETE of that scope is in flight. The probe must call that a violation, and must
 * not blame the stack for locks the chaos suite's own connections hold.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../../functions/adapters/database.ts';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { type LocalProvisioner, startProvisioner } from '../../infra/local/provisioner/server.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { finishedRootRun, type Scenario } from '../support/factories.ts';
import { LockProbe, type ProbeVerdict } from './lock-probe.ts';

const STACK = 'probe-test-stack';
const WINDOW_MS = 300;

let t: TestDatabase;
let provisioner: LocalProvisioner;
let rootDir: string;
let client: ProvisionerClient;
let probeDb: Database;

async function pool(applicationName: string): Promise<Database> {
  return t.connect({ applicationName, maxConnections: 2, lockTimeoutMs: 2_000 });
}

beforeAll(async () => {
  t = await createTestDatabase();
  rootDir = await mkdtemp(join(tmpdir(), 'chaos-probe-'));
  provisioner = await startProvisioner({ rootDir, graceMs: 100 });
  client = new ProvisionerClient(provisioner.url);
  probeDb = await pool('probe-test-probe');
});
afterAll(async () => {
  await client?.close();
  await provisioner?.stop();
  await t?.drop();
  await rm(rootDir, { recursive: true, force: true });
});

/**
 * Sends a DELETE for the scope's sandbox while `holder` keeps a transaction open with its locks
 * (the scope's advisory lock, the run's row lock, or both).
 */
async function deleteWhileHeld(
  s: Scenario,
  holder: Database | undefined,
  locks: { advisory: boolean; row: boolean } = { advisory: true, row: true },
): Promise<ProbeVerdict> {
  const probe = new LockProbe(probeDb, STACK, WINDOW_MS);
  let verdict: ProbeVerdict | undefined;
  const remove = provisioner.onRequest(async (info) => {
    if (info.method === 'DELETE' && info.sandboxId === s.sandboxId) {
      verdict = await probe.probe({ uid: s.uid, runtimeScopeId: s.runtimeScopeId });
    }
  });
  try {
    const send = () =>
      client.deleteSandbox({ sandboxId: s.sandboxId, generation: s.generation, deleteTimeoutMs: 5_000 });
    if (!holder) await send();
    else {
      await holder.withTransaction(async (tx) => {
        if (locks.advisory) {
          await tx.query('SELECT pg_advisory_xact_lock(runtime_cleanup_lock_key($1::text, $2::text))', [
            s.uid,
            s.runtimeScopeId,
          ]);
        }
        if (locks.row)
          await tx.query('SELECT 1 FROM agent_runs WHERE id = $1::text FOR UPDATE', [s.rootRunId]);
        await send();
      });
    }
  } finally {
    remove();
  }
  if (!verdict) throw new Error('the probe did not run');
  return verdict;
}

describe('the invariant-3 lock probe', () => {
  it('finds the locks free when no transaction spans the DELETE', async () => {
    const s = await finishedRootRun(t.db);
    expect((await deleteWhileHeld(s, undefined)).kind).toBe('free');
  });

  it('reports a violation when a stack connection holds the scope lock and row lock across the DELETE', async () => {
    const s = await finishedRootRun(t.db);
    const verdict = await deleteWhileHeld(s, await pool(STACK));
    expect(verdict.kind).toBe('violation');
    if (verdict.kind !== 'violation') return;
    expect(verdict.heldForMs).toBeGreaterThanOrEqual(WINDOW_MS);
    expect(verdict.sightings).toBeGreaterThanOrEqual(2);
    expect(new Set(verdict.holders.map((holder) => holder.lock))).toEqual(new Set(['advisory', 'row']));
    expect(verdict.holders.every((holder) => holder.applicationName === STACK)).toBe(true);
  });

  // The probe tries both locks in one statement (one round trip inside the DELETE): each lock
  // alone must still be found, the advisory one by its answer, the row by NOWAIT's error.
  it.each([
    ['the advisory lock alone', { advisory: true, row: false }, 'advisory'],
    ['the row lock alone', { advisory: false, row: true }, 'row'],
  ] as const)(
    'reports a violation when a stack connection holds %s across the DELETE',
    async (_, locks, lock) => {
      const s = await finishedRootRun(t.db);
      const verdict = await deleteWhileHeld(s, await pool(STACK), locks);
      expect(verdict.kind).toBe('violation');
      if (verdict.kind !== 'violation') return;
      expect(verdict.heldForMs).toBeGreaterThanOrEqual(WINDOW_MS);
      expect(verdict.holders.map((holder) => holder.lock)).toEqual([lock]);
    },
  );

  it('does not blame the stack for locks another application holds', async () => {
    const s = await finishedRootRun(t.db);
    const verdict = await deleteWhileHeld(s, await pool('probe-test-platform'));
    expect(verdict.kind).toBe('held_by_chaos');
  });
});
