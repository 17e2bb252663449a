/**
 * The chaos suite in `npm test`: a fixed seed, few runs, every fault kind forced at least once
 * (the coverage cycle: a forced run keeps its faults up until its kind fired), all invariants
 * checked during and after, logs on at INFO and searched for the database password. The report goes to test/chaos/results/fixed-seed.{json,md}. The large
 * randomized report is the CLI's (`npm run chaos`), committed beside it.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { ENGINE_LOCK_WAIT_MS, runCoverageCycleInTurn } from './engine-lock.ts';
import { Invariant } from './invariants.ts';
import { COVERAGE_CYCLE, DEFAULT_MIX, FaultKind } from './plan.ts';
import { silenceEmptyMetricsWarning } from './quiet.ts';
import type { ReclaimChaosReport } from './reclaim-chaos.ts';
import { writeReport } from './report.ts';
import type { ChaosResult } from './result.ts';
import { CONVERGENCE_BOUND_MS } from './settings.ts';

const RESULTS_DIR = fileURLToPath(new URL('./results/', import.meta.url));
const SEED = 20261130;

let t: TestDatabase;
let dataDir: string;
let result: ChaosResult;
const logLines: string[] = [];
let secret: string;
let reclaimReport: ReclaimChaosReport | undefined;

beforeAll(async () => {
  t = await createTestDatabase();
  dataDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-chaos-test-'));
  // The stack logs at INFO with this URL's password in its configuration. Trust authentication
  // ignores a password, so one is added when the test cluster has none: there is always a secret
  // that must not show up in any log line.
  const url = new URL(t.url);
  if (!url.password) url.password = `chaos-secret-${randomBytes(6).toString('hex')}`;
  secret = decodeURIComponent(url.password);

  // Log lines (JSON, on stdout and stderr) are kept for the search and not echoed.
  const restoreStderr = silenceEmptyMetricsWarning();
  const restore = [process.stdout, process.stderr].map((stream) => {
    const write = stream.write.bind(stream);
    stream.write = ((chunk: unknown, ...rest: unknown[]) => {
      const text = typeof chunk === 'string' ? chunk : Buffer.isBuffer(chunk) ? chunk.toString('utf8') : '';
      if (text.startsWith('{')) {
        logLines.push(...text.split('\n').filter(Boolean));
        return true;
      }
      return (write as (...args: unknown[]) => boolean)(chunk, ...rest);
    }) as typeof stream.write;
    return () => {
      stream.write = write;
    };
  });
  try {
    result = await runCoverageCycleInTurn('chaos.test.ts', {
      seed: SEED,
      databaseUrl: url.toString(),
      driver: t.driver,
      wsProxy: t.wsProxy,
      dataDir,
      mix: { ...DEFAULT_MIX, maxFaultWindowMs: 2_500 },
      logLevel: 'INFO',
      // Reclaimer hook (issue 13): leak injection and invariant GC.
      reclaim: {
        onReport: (report) => {
          reclaimReport = report;
        },
      },
    });
  } finally {
    for (const undo of restore) undo();
    restoreStderr();
  }
  await writeReport(result, RESULTS_DIR, 'fixed-seed');
}, ENGINE_LOCK_WAIT_MS + 300_000);

afterAll(async () => {
  await t?.drop();
  await rm(dataDir, { recursive: true, force: true });
});

describe(`chaos suite, seed ${SEED}`, () => {
  it('violates no invariant, and the harness itself ran clean', () => {
    expect(result.violations).toEqual([]);
    expect(result.harnessErrors).toEqual([]);
  });

  it('checked every invariant many times (a check that never ran proves nothing)', () => {
    for (const invariant of Object.values(Invariant)) {
      expect(result.checks[invariant].checked, invariant).toBeGreaterThan(0);
    }
    expect(result.checks[Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE].checked).toBeGreaterThanOrEqual(
      result.runs,
    );
    expect(result.checks[Invariant.NO_LOCK_HELD_DURING_PROVISIONER_CALL].checked).toBeGreaterThanOrEqual(
      result.runs,
    );
  });

  it('fired every kind of fault the coverage cycle forces, each in the run it was forced on', () => {
    expect(result.coverage.missed).toEqual([]);
    for (const kind of COVERAGE_CYCLE) expect(result.coverage.fired[kind] ?? 0, kind).toBeGreaterThan(0);
    // Terminations come from a timer rather than a plan; the coverage run waits for one.
    expect(result.faultsInjected[FaultKind.DB_BACKEND_TERMINATED] ?? 0).toBeGreaterThan(0);
    const lostAcks = Object.entries(result.faultsInjected).filter(([kind]) =>
      kind.startsWith(FaultKind.CRASH_BEFORE_ACK),
    );
    expect(lostAcks.length, 'a crash after a handler finished, before its ack').toBeGreaterThan(0);
  });

  it('converged: every fence cleared within the stated bound once its faults stopped, and the system drained', () => {
    expect(result.convergence.samples).toBeGreaterThanOrEqual(result.runs);
    expect(result.convergence.maxMs).toBeLessThanOrEqual(CONVERGENCE_BOUND_MS);
  });

  it('reclaimed every injected leak, never a sandbox of an active or fenced scope (invariant GC)', () => {
    expect(reclaimReport!.leaksInjected).toBeGreaterThan(0);
    expect(reclaimReport!.leaksStillLive).toEqual([]);
    expect(reclaimReport!.reclaimDeletes).toBeGreaterThanOrEqual(reclaimReport!.leaksInjected);
    expect(reclaimReport!.violations).toEqual([]);
  });

  it('logged at INFO throughout without the database password in any line', () => {
    expect(logLines.length).toBeGreaterThan(100);
    expect(logLines.filter((line) => line.includes(secret))).toEqual([]);
  });
});
