/**
 * Coverage by construction: every forced run gets a fault window of 0 ms, so nothing could fire
 * inside it by timing. Each forced kind must fire anyway, because its run keeps its faults up
 * until the kind's trigger point was reached (a crash at the last step boundary, every dropped
 * acknowledgement, the DELETE a provisioner fault sits on, the moment after the DELETE). A
 * harness that lifted the faults when the window ended — as the suite once did, and then failed
 * under load with "crash_after_finalize_commit_before_cleaned_publish: expected 0" — fails here
 * on every run.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { ENGINE_LOCK_WAIT_MS, runCoverageCycleInTurn } from './engine-lock.ts';
import { COVERAGE_CYCLE, DEFAULT_MIX, FaultKind } from './plan.ts';
import { silenceEmptyMetricsWarning } from './quiet.ts';
import type { ChaosResult } from './result.ts';

const SEED = 20261201;

let t: TestDatabase;
let dataDir: string;
let result: ChaosResult;

beforeAll(async () => {
  t = await createTestDatabase();
  dataDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-coverage-test-'));
  const restoreStderr = silenceEmptyMetricsWarning();
  try {
    result = await runCoverageCycleInTurn('coverage.test.ts', {
      seed: SEED,
      databaseUrl: t.url,
      driver: t.driver,
      wsProxy: t.wsProxy,
      dataDir,
      mix: { ...DEFAULT_MIX, forcedWindowMs: 0 },
      // The reclaimer's fault kinds are in the cycle: they need it running beside the protocol.
      reclaim: { onReport: () => {} },
    });
  } finally {
    restoreStderr();
  }
  // As chaos.test.ts: a bound for a harness that hangs, not a measure of speed. Each forced kind
  // waits for its trigger up to its own deadline; on a loaded two-core machine the run took 180 s.
}, ENGINE_LOCK_WAIT_MS + 300_000);

afterAll(async () => {
  await t?.drop();
  await rm(dataDir, { recursive: true, force: true });
});

describe(`coverage cycle with zero-length fault windows, seed ${SEED}`, () => {
  it('fired every forced kind in its own run, however short its window', () => {
    expect(result.harnessErrors).toEqual([]);
    expect(result.coverage.missed).toEqual([]);
    for (const kind of COVERAGE_CYCLE) expect(result.coverage.fired[kind] ?? 0, kind).toBeGreaterThan(0);
    expect(result.faultsInjected[FaultKind.DB_BACKEND_TERMINATED] ?? 0).toBeGreaterThan(0);
  });

  it('still violated no invariant', () => {
    expect(result.violations).toEqual([]);
  });
});
