/**
 * The checkers are the chaos suite's judges, so they are tested first: each one is fed a small
 * history that keeps its property and the same history broken in exactly one way, and must tell
 * the two apart. A checker that could not fail would make every chaos report worthless.
 */
import { describe, expect, it } from 'vitest';
import {
  type CapturedRelease,
  checkSafety,
  confirmsGone,
  convergenceOf,
  type DeleteRequest,
  type History,
  Invariant,
  percentile,
} from '../chaos/invariants.ts';
import type { RunLogEntry, SandboxLogEntry } from '../chaos/ledger.ts';

const UID = 'user-1';
const SCOPE = 'scope-1';
const SANDBOX = 'sbx-scope-1';
const FENCE_TEXT = '2026-11-30 05:00:01.000000+00';

let seq = 0;
function run(
  atMs: number,
  values: Partial<RunLogEntry> & Pick<RunLogEntry, 'status' | 'pending'>,
  txid = `tx-${atMs}`,
): RunLogEntry {
  seq += 1;
  return {
    seq,
    atMs,
    txid,
    runId: 'run-1',
    uid: UID,
    runtimeScopeId: SCOPE,
    runType: 'chat',
    createdByRunId: null,
    pendingSinceMs: values.pending ? 1_000 : null,
    pendingSinceText: values.pending ? FENCE_TEXT : null,
    ...values,
  };
}

function sandbox(atMs: number, values: Partial<SandboxLogEntry> = {}, txid = `tx-${atMs}`): SandboxLogEntry {
  seq += 1;
  return {
    seq,
    atMs,
    txid,
    uid: UID,
    runtimeScopeId: SCOPE,
    sandboxId: SANDBOX,
    generation: 1,
    released: false,
    ...values,
  };
}

function del(values: Partial<DeleteRequest> & Pick<DeleteRequest, 'startedAt'>): DeleteRequest {
  seq += 1;
  return {
    seq,
    path: `/api/sandboxes/${SANDBOX}`,
    sandboxId: SANDBOX,
    generation: 1,
    status: 200,
    outcome: 'answered',
    fault: undefined,
    endedAt: values.startedAt + 5,
    deletedGeneration: 1,
    ...values,
  };
}

const capture: CapturedRelease = {
  origin: 'stack',
  sentAtMs: 1_050,
  runId: 'run-1',
  uid: UID,
  runtimeScopeId: SCOPE,
  sandboxId: SANDBOX,
  generation: 1,
  fenceSetAt: FENCE_TEXT,
};

/** A clean lifecycle: admitted at 0, sandbox g1 recorded at 10, finished at 1000, deleted at 1100, cleared at 1200. */
function healthy(): History {
  return {
    runLog: [
      run(0, { status: 'running', pending: false }),
      run(1_000, { status: 'completed', pending: true }),
      run(1_200, { status: 'completed', pending: false }, 'tx-clear'),
    ],
    sandboxLog: [sandbox(10), sandbox(1_200, { released: true }, 'tx-clear')],
    deletes: [del({ startedAt: 1_100 })],
    sandboxScope: new Map([[SANDBOX, `${UID}\u0000${SCOPE}`]]),
    releases: [capture],
    fenceTextToLocalMs: () => 1_000,
    settledBeforeMs: Number.POSITIVE_INFINITY,
  };
}

const invariantsOf = (history: History) => checkSafety(history).violations.map((v) => v.invariant);

describe('the safety checkers', () => {
  it('find nothing wrong in a clean lifecycle, and say how much they checked', () => {
    const { violations, counts } = checkSafety(healthy());
    expect(violations).toEqual([]);
    expect(counts).toEqual({ clearsChecked: 1, deletesChecked: 1, capturesChecked: 1, deletionsChecked: 1 });
  });

  it('flag a fence cleared with no delete of its generation (invariant 1)', () => {
    const history = { ...healthy(), deletes: [] };
    expect(invariantsOf(history)).toContain(Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE);
  });

  it('flag a fence cleared on a delete answered before the fence was set (invariant 1)', () => {
    const history = { ...healthy(), deletes: [del({ startedAt: 900 })] };
    expect(invariantsOf(history)).toContain(Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE);
  });

  it('flag a fence cleared while its delete had only failed, timed out or been refused (invariant 1)', () => {
    for (const failed of [
      del({ startedAt: 1_100, status: 503, deletedGeneration: undefined }),
      del({ startedAt: 1_100, status: undefined, outcome: 'aborted', deletedGeneration: undefined }),
      del({ startedAt: 1_100, status: 409, fault: 'conflict:0', deletedGeneration: undefined }),
    ]) {
      expect(invariantsOf({ ...healthy(), deletes: [failed] })).toContain(
        Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE,
      );
    }
  });

  it('flag a sandbox recorded while the fence was up that nobody deleted before the clear (invariant 1)', () => {
    const history = healthy();
    history.sandboxLog = [
      sandbox(10),
      sandbox(1_150, { sandboxId: 'sbx-scope-1-r1', generation: 1 }),
      sandbox(1_200, { released: true, sandboxId: 'sbx-scope-1-r1' }, 'tx-clear'),
    ];
    history.sandboxScope = new Map([...history.sandboxScope, ['sbx-scope-1-r1', `${UID}\u0000${SCOPE}`]]);
    expect(invariantsOf(history)).toEqual([Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE]);
  });

  it('accept a clear with nothing to delete when the generation was already released (the absent case)', () => {
    const history = healthy();
    history.sandboxLog = [sandbox(10), sandbox(500, { released: true })];
    history.deletes = [];
    history.releases = [];
    expect(invariantsOf(history)).toEqual([]);
  });

  it('flag a DELETE that named no generation, or one that no fence check captured (invariant 2a)', () => {
    expect(
      invariantsOf({ ...healthy(), deletes: [del({ startedAt: 1_100, generation: undefined })] }),
    ).toContain(Invariant.ONLY_CAPTURED_GENERATION_DELETED);
    expect(invariantsOf({ ...healthy(), releases: [] })).toContain(
      Invariant.ONLY_CAPTURED_GENERATION_DELETED,
    );
  });

  it('flag a capture that named another generation than the scope had while fenced (invariant 2a)', () => {
    const history = { ...healthy(), releases: [{ ...capture, generation: 2 }] };
    expect(invariantsOf(history)).toContain(Invariant.ONLY_CAPTURED_GENERATION_DELETED);
  });

  it('flag a sandbox deleted while a run of its scope was still running (invariant 2b)', () => {
    const history = healthy();
    history.runLog = [
      ...history.runLog,
      run(1_050, { runId: 'run-child', runType: 'subagent', status: 'running', pending: false }),
      run(1_500, { runId: 'run-child', runType: 'subagent', status: 'completed', pending: false }),
    ];
    expect(invariantsOf(history)).toEqual([Invariant.NO_DELETE_UNDER_ACTIVE_RUN]);
  });

  it('judge only settled events (the last seconds may not be fully recorded yet)', () => {
    expect(invariantsOf({ ...healthy(), deletes: [], settledBeforeMs: 1_100 })).toEqual([]);
  });

  it('count a 409 as a confirmation only when it names a newer generation and arrived in full', () => {
    expect(confirmsGone(del({ startedAt: 0, status: 409, fault: 'conflict:3' }), 2)).toBe(true);
    expect(confirmsGone(del({ startedAt: 0, status: 409, fault: 'conflict:1' }), 2)).toBe(false);
    expect(confirmsGone(del({ startedAt: 0, status: 409, outcome: 'aborted' }), 2)).toBe(false);
    expect(confirmsGone(del({ startedAt: 0, status: 200, outcome: 'aborted' }), 2)).toBe(true);
    expect(confirmsGone(del({ startedAt: 0, status: undefined, outcome: 'reset' }), 2)).toBe(false);
  });
});

describe('the convergence measurement', () => {
  it('starts the clock at the latest of fence set, faults stopped and the scope going idle', () => {
    const history = healthy();
    const child = [
      run(1_050, { runId: 'run-child', runType: 'subagent', status: 'running', pending: false }),
      run(1_150, { runId: 'run-child', runType: 'subagent', status: 'completed', pending: false }),
    ];
    const { samples, uncleared } = convergenceOf(
      [...history.runLog, ...child],
      [{ rootRunIds: ['run-1'], faultsStoppedAtMs: 1_100 }],
    );
    expect(uncleared).toEqual([]);
    expect(samples).toEqual([
      { runId: 'run-1', fenceToClearMs: 200, convergenceMs: 50, fencedWhenFaultsStopped: true },
    ]);
  });

  it("counts a stack-wide episode that began before the clear as one of every run's faults", () => {
    const history = healthy();
    const runs = [{ rootRunIds: ['run-1'], faultsStoppedAtMs: 1_000 }];
    // A storm from 1,050 to 1,150 (the clear is at 1,200): the clock starts at 1,150.
    expect(
      convergenceOf(history.runLog, runs, [{ startMs: 1_050, endMs: 1_150 }]).samples[0]?.convergenceMs,
    ).toBe(50);
    // One that began after the clear does not move it.
    expect(
      convergenceOf(history.runLog, runs, [{ startMs: 1_300, endMs: 1_400 }]).samples[0]?.convergenceMs,
    ).toBe(200);
  });

  it('reports a fence that never came down', () => {
    const history = healthy();
    const { uncleared } = convergenceOf(history.runLog.slice(0, 2), [
      { rootRunIds: ['run-1'], faultsStoppedAtMs: 0 },
    ]);
    expect(uncleared).toEqual(['run-1']);
  });

  it('takes nearest-rank percentiles', () => {
    expect(percentile([5, 1, 4, 2, 3], 50)).toBe(3);
    expect(percentile([1, 2, 3, 4, 100], 99)).toBe(100);
    expect(percentile([], 99)).toBe(0);
  });
});
