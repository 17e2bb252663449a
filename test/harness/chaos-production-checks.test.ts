/**
 * The judges of issue 11's faults, each fed a history that keeps its property and the same
 * history broken the way the reverted fix breaks it (test/chaos/results/fix-reverted.md shows the
 * same in real runs): a check that could not fail would make "0 violations" meaningless.
 */
import { describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../infra/local/provisioner/server.ts';
import { deleteRequestOf } from '../chaos/history.ts';
import {
  checkSafety,
  confirmsGone,
  type DeleteRequest,
  type History,
  Invariant,
  withoutInheritedRelease,
} from '../chaos/invariants.ts';
import type { RunLogEntry, SandboxLogEntry } from '../chaos/ledger.ts';
import {
  checkForgedReleases,
  checkProvisionerReplies,
  type DeadLetterFacts,
} from '../chaos/production-checks.ts';
import type { ForgedExpectation } from '../chaos/production-faults.ts';

const UID = 'user-1';
const SCOPE = 'scope-1';
const SANDBOX = 'sbx-scope-1';
const FENCE_TEXT = '2026-11-30 05:00:01.000000+00';
let seq = 0;

function run(
  atMs: number,
  values: Partial<RunLogEntry> & Pick<RunLogEntry, 'status' | 'pending'>,
): RunLogEntry {
  seq += 1;
  return {
    seq,
    atMs,
    txid: `tx-${atMs}`,
    runId: 'run-1',
    uid: UID,
    runtimeScopeId: SCOPE,
    runType: 'chat',
    createdByRunId: null,
    pendingSinceMs: values.pending ? atMs : null,
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

function history(values: Partial<History>): History {
  return {
    runLog: [],
    sandboxLog: [],
    deletes: [],
    sandboxScope: new Map([[SANDBOX, `${UID}\u0000${SCOPE}`]]),
    releases: [],
    fenceTextToLocalMs: () => 0,
    settledBeforeMs: Number.POSITIVE_INFINITY,
    ...values,
  };
}

const invariantsOf = (h: History) => checkSafety(h).violations.map((v) => v.invariant);

describe('fences never cleared on a non-confirmation', () => {
  it('does not take an injected 200 (a catch-all HTML page) for a confirmation', () => {
    expect(confirmsGone(del({ startedAt: 0, fault: 'status:200', deletedGeneration: undefined }), 1)).toBe(
      false,
    );
    expect(confirmsGone(del({ startedAt: 0 }), 1)).toBe(true);
  });

  it('takes a 410 for gone', () => {
    expect(confirmsGone(del({ startedAt: 0, status: 410, fault: 'gone' }), 1)).toBe(true);
  });

  it('flags a fence cleared after only an HTML 200 (invariant 1)', () => {
    const h = history({
      runLog: [
        run(0, { status: 'running', pending: false }),
        run(1_000, { status: 'completed', pending: true }),
        run(1_200, { status: 'completed', pending: false, txid: 'tx-clear' }),
      ],
      sandboxLog: [sandbox(10), sandbox(1_200, { released: true }, 'tx-clear')],
      deletes: [del({ startedAt: 1_100, fault: 'status:200', deletedGeneration: undefined })],
    });
    expect(invariantsOf(h)).toContain(Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE);
  });
});

describe('a new generation never inherits released_at (issue 11.3)', () => {
  it('judges a new generation that reads released at once as unreleased', () => {
    const released = sandbox(100, { released: true });
    expect(withoutInheritedRelease(sandbox(200, { generation: 2, released: true }), released).released).toBe(
      false,
    );
    // finalize marking the same generation released is a release
    expect(withoutInheritedRelease(sandbox(200, { released: true }), sandbox(100)).released).toBe(true);
  });

  it('flags a fence cleared as "nothing to delete" over a generation that inherited released_at', () => {
    // g1 released by its cleanup; the platform records g2 with released_at kept; the next run's
    // fence is cleared without any DELETE of g2.
    const h = history({
      runLog: [
        run(2_000, { runId: 'run-2', status: 'running', pending: false }),
        run(3_000, { runId: 'run-2', status: 'completed', pending: true }),
        run(3_100, { runId: 'run-2', status: 'completed', pending: false, txid: 'tx-clear' }),
      ],
      sandboxLog: [
        sandbox(10),
        sandbox(1_200, { released: true }),
        sandbox(2_010, { generation: 2, released: true }),
      ],
    });
    expect(invariantsOf(h)).toEqual([Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE]);
    // With the trigger, g2 reads unreleased and the cleanup must (and here did) delete it.
    const fixed = history({
      ...h,
      sandboxLog: [
        sandbox(10),
        sandbox(1_200, { released: true }),
        sandbox(2_010, { generation: 2 }),
        sandbox(3_100, { generation: 2, released: true }, 'tx-clear'),
      ],
      deletes: [del({ startedAt: 3_050, generation: 2, deletedGeneration: 2 })],
      releases: [
        {
          origin: 'stack',
          sentAtMs: 3_020,
          runId: 'run-2',
          uid: UID,
          runtimeScopeId: SCOPE,
          sandboxId: SANDBOX,
          generation: 2,
          fenceSetAt: FENCE_TEXT,
        },
      ],
      fenceTextToLocalMs: () => 3_000,
    });
    expect(invariantsOf(fixed)).toEqual([]);
  });
});

describe('no delete of a generation in use by an active run, with platform reuse (invariant 2b)', () => {
  it('flags a DELETE sent before a new run was admitted that deleted after (its client had given up)', () => {
    // Run A's DELETE starts at 1,100 and its client gives up at 2,100; a forced clear lets run B
    // in at 1,500 with the same live sandbox; the provisioner deletes at 3,000 while B runs.
    const h = history({
      runLog: [
        run(1_000, { status: 'completed', pending: false }),
        run(1_500, { runId: 'run-b', status: 'running', pending: false }),
        run(3_500, { runId: 'run-b', status: 'completed', pending: false }),
      ],
      sandboxLog: [sandbox(10)],
      deletes: [
        del({
          startedAt: 1_100,
          endedAt: 1_100,
          status: undefined,
          outcome: 'aborted',
          deletedGeneration: 1,
          deletedAt: 3_000,
        }),
      ],
    });
    const found = checkSafety(h).violations.filter(
      (v) => v.invariant === Invariant.NO_DELETE_UNDER_ACTIVE_RUN,
    );
    expect(found).toHaveLength(1);
    // The same DELETE carried out before B was admitted harms nobody.
    const early = history({ ...h, deletes: [{ ...h.deletes[0]!, deletedAt: 1_200 }] });
    expect(
      checkSafety(early).violations.filter((v) => v.invariant === Invariant.NO_DELETE_UNDER_ACTIVE_RUN),
    ).toEqual([]);
  });
});

describe('forged releases are refused with their own reason (invariant G)', () => {
  const forged = new Map<string, ForgedExpectation>([
    [
      'm-uid',
      { variant: 'wrong_uid', runId: 'run-1', codes: ['RELEASE_SCOPE_MISMATCH'], staleMayBeSkipped: false },
    ],
    [
      'm-sandbox',
      {
        variant: 'unowned_sandbox',
        runId: 'run-1',
        codes: ['RELEASE_SANDBOX_MISMATCH'],
        staleMayBeSkipped: true,
      },
    ],
  ]);
  const letter = (source: string, errorCode: string): DeadLetterFacts => ({
    sourceMessageId: source,
    errorCode,
    body: '{}',
  });

  it('accepts each refused with its code, a late one skipped as stale, and the decoy alive', () => {
    const result = checkForgedReleases({
      forged,
      releaseDeadLetters: [letter('m-uid', 'RELEASE_SCOPE_MISMATCH')],
      acked: new Set(['m-uid', 'm-sandbox']),
      decoys: new Set(['sbx-decoy']),
      liveSandboxIds: new Set(['sbx-decoy']),
    });
    expect(result).toEqual({ violations: [], checked: 3 });
  });

  it('flags a forgery processed as a cleanup, one refused for another reason, and a deleted decoy', () => {
    const processed = checkForgedReleases({
      forged,
      releaseDeadLetters: [],
      acked: new Set(['m-uid', 'm-sandbox']),
      decoys: new Set(['sbx-decoy']),
      liveSandboxIds: new Set(),
    });
    expect(processed.violations.map((v) => v.key)).toEqual(['G:m-uid', 'G:decoy:sbx-decoy']);
    const wrongCode = checkForgedReleases({
      forged,
      releaseDeadLetters: [letter('m-uid', 'RUN_NOT_FOUND'), letter('m-sandbox', 'RELEASE_SANDBOX_MISMATCH')],
      acked: new Set(['m-uid', 'm-sandbox']),
      decoys: new Set(),
      liveSandboxIds: new Set(),
    });
    expect(wrongCode.violations.map((v) => v.invariant)).toEqual([Invariant.FORGED_RELEASES_REFUSED]);
  });

  it('leaves a decoy the reclaimer collected to invariant GC, and flags one a release deleted', () => {
    const base = {
      forged: new Map<string, ForgedExpectation>(),
      releaseDeadLetters: [],
      acked: new Set<string>(),
      decoys: new Set(['sbx-decoy']),
      liveSandboxIds: new Set<string>(),
    };
    const releaseDelete = {
      seq: 1,
      path: '/api/sandboxes/sbx-decoy',
      sandboxId: 'sbx-decoy',
      generation: 1,
      status: 200,
      outcome: 'deleted',
      fault: undefined,
      startedAt: 1,
      endedAt: 2,
      deletedGeneration: 1,
    };
    // Gone, but no DELETE of the fence protocol removed it: the reclaimer did.
    expect(checkForgedReleases({ ...base, protocolDeletes: [] }).violations).toEqual([]);
    // A DELETE of the protocol that did not delete it (refused, 404) is not a deletion either.
    expect(
      checkForgedReleases({ ...base, protocolDeletes: [{ ...releaseDelete, deletedGeneration: undefined }] })
        .violations,
    ).toEqual([]);
    expect(
      checkForgedReleases({ ...base, protocolDeletes: [releaseDelete] }).violations.map((v) => v.key),
    ).toEqual(['G:decoy:sbx-decoy']);
  });
});

describe('the provisioner replies of contract v1.1 §3 are honoured (invariant R)', () => {
  const rejected: DeadLetterFacts = {
    sourceMessageId: 'm-1',
    errorCode: 'PROVISIONER_REJECTED',
    body: JSON.stringify({ sandboxId: SANDBOX }),
  };

  it('flags a release dead-lettered as rejected after only 429, 408 or 410 answers', () => {
    for (const status of [429, 408, 410]) {
      const result = checkProvisionerReplies({
        releaseDeadLetters: [rejected],
        deletes: [del({ startedAt: 0, status, deletedGeneration: undefined })],
        retryCapMs: 2_000,
      });
      expect(
        result.violations.map((v) => v.invariant),
        String(status),
      ).toEqual([Invariant.PROVISIONER_REPLIES_HONOURED]);
    }
  });

  it('accepts a rejection the provisioner really made (a 422)', () => {
    const result = checkProvisionerReplies({
      releaseDeadLetters: [rejected],
      deletes: [del({ startedAt: 0, status: 422, deletedGeneration: undefined })],
      retryCapMs: 2_000,
    });
    expect(result).toEqual({ violations: [], checked: 1 });
  });

  const throttled = (askedMs: number, at = 0) =>
    del({
      startedAt: at,
      endedAt: at + 10,
      status: 429,
      fault: 'status:429+retry-after',
      retryAfterAskedMs: askedMs,
    });
  const retryFlags = (deletes: DeleteRequest[]) =>
    checkProvisionerReplies({ releaseDeadLetters: [], deletes, retryCapMs: 2_000 }).violations;

  it('flags a retry sooner than a 429 asked, within the cap', () => {
    const check = (nextAtMs: number, askedMs: number) =>
      retryFlags([throttled(askedMs), del({ startedAt: nextAtMs })]).length;
    expect(check(400, 1_000)).toBe(1);
    expect(check(1_010, 1_000)).toBe(0);
    // An HTTP-date asks for what is left until that date, not a whole number of seconds.
    expect(check(1_250, 1_300)).toBe(0);
    expect(check(1_000, 1_300)).toBe(1);
    // Asked for more than the cap: the cap is what is owed.
    expect(check(2_010, 5_000)).toBe(0);
    expect(check(1_500, 5_000)).toBe(1);
  });

  it('judges each 429 by what that answer asked, when a later run of the scope asked for more', () => {
    // A scope's runs share its sandbox id: run 1's 429 asked 1 s and was retried after 1.07 s;
    // run 2's, much later, asked 2 s. Judging run 1's retry by run 2's ask was the false report
    // of the 2026-11-30 chaos run.
    const deletes = [
      throttled(1_000, 0),
      del({ startedAt: 1_080 }),
      throttled(2_000, 30_000),
      del({ startedAt: 32_020, generation: 2, deletedGeneration: 2 }),
    ];
    expect(retryFlags(deletes)).toEqual([]);
    const early = retryFlags([...deletes.slice(0, 3), del({ startedAt: 31_080, generation: 2 })]);
    expect(early.map((violation) => violation.key)).toEqual([`R:retry-after:${deletes[2]!.seq}`]);
    expect(early[0]!.message).toContain('asked for 2000 ms');
  });

  it('reads the ask from the provisioner’s audit, as the chaos history is built from it', () => {
    // The path the check depends on: audit entry → history DELETE. Were the ask dropped on the
    // way, every 429 would look like a raw header and R would judge no retry at all.
    const entry: AuditEntry = {
      seq: 7,
      at: 1_000,
      method: 'DELETE',
      path: `/api/sandboxes/${SANDBOX}`,
      sandboxId: SANDBOX,
      generation: 3,
      status: 429,
      outcome: 'answered',
      fault: 'status:429+retry-after',
      retryAfter: '2',
      retryAfterAskedMs: 2_000,
      startedAt: 1_000,
      endedAt: 1_010,
    };
    const request = deleteRequestOf(entry);
    expect(request).toMatchObject({ seq: 7, generation: 3, status: 429, retryAfterAskedMs: 2_000 });
    expect(retryFlags([request, del({ startedAt: 1_500 })])).toHaveLength(1);
  });

  it('does not judge a retry after a Retry-After whose meaning is unknown (a raw header)', () => {
    const raw = del({ startedAt: 0, endedAt: 10, status: 429, fault: 'status:429+retry-after' });
    expect(retryFlags([raw, del({ startedAt: 20 })])).toEqual([]);
  });
});
