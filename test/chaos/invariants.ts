/**
 * The safety invariants, checked by code over what was recorded: the ledger (run and sandbox
 * transitions, database clock moved onto this process's timeline), the provisioner's audit of
 * every DELETE, and the release commands the fence check published. Pure functions: the fixed-seed
 * test feeds them known-bad histories to show each check does fail when its property breaks.
 *
 * 1  A fence is cleared only after the generation it guarded was confirmed gone (DELETE answered
 *    200, 404, or 409 naming a newer generation) later than the fence was last set — for the
 *    generation recorded when it was set and for every one recorded while it was up. A scope with
 *    no unreleased generation needs no delete (the "absent" case); a later clear of a re-raised
 *    fence needs a confirmation after the re-raise.
 * 2a Every DELETE names a generation (a DELETE without one would delete whatever is live), deletes
 *    nothing but the generation it names, and names a (sandbox, generation) that a fence check
 *    captured for that scope; every capture named the scope's generation as it stood while the
 *    fence was up.
 * 2b No sandbox was deleted while a non-terminal run of its scope existed.
 */

import { ascending, nearestRank } from '../../infra/local/nearest-rank.ts';
import { NON_TERMINAL_RUN_STATUSES, TERMINAL_RUN_STATUSES } from '../../infra/run-statuses.ts';
import type { RunLogEntry, SandboxLogEntry } from './ledger.ts';

export const Invariant = {
  FENCE_CLEARED_AFTER_CONFIRMED_DELETE: '1-fence-cleared-only-after-confirmed-delete',
  ONLY_CAPTURED_GENERATION_DELETED: '2a-only-the-captured-generation-is-deleted',
  NO_DELETE_UNDER_ACTIVE_RUN: '2b-no-delete-while-a-run-of-the-scope-is-active',
  NO_LOCK_HELD_DURING_PROVISIONER_CALL: '3-no-cleanup-lock-held-during-a-provisioner-request',
  CONVERGENCE: '4-every-fence-clears-within-the-bound-once-faults-stop',
  NOTHING_LOST: '5-nothing-lost',
  NO_SANDBOX_LEAKED: '1b-no-sandbox-left-behind-by-a-cleared-fence',
  IDS_PERCENT_ENCODED: 'S1-sandbox-ids-reach-the-provisioner-as-one-percent-encoded-segment',
  /** Issue 11.5: 429/408 are retried (no sooner than Retry-After asks, within the cap), 410 is gone. */
  PROVISIONER_REPLIES_HONOURED: 'R-retryable-and-gone-replies-are-not-dead-lettered-as-rejected',
  /** Issue 11.2: a forged or mismatched release is refused with its own reason and deletes nothing. */
  FORGED_RELEASES_REFUSED: 'G-forged-releases-refused-with-their-own-reason-before-any-delete',
  /** Issue 11.4: no process the chaos suite started exits unless it was asked to. */
  NO_PROCESS_EXITS: 'P-no-process-of-the-stack-exits-while-faults-run',
  /** Issue 11.4: a database connect that never answers is abandoned within the connect timeout. */
  CONNECT_ABANDONED: 'T-a-connect-that-never-answers-is-abandoned-within-the-connect-timeout',
  // Reclaimer hook (issue 13): checked by test/chaos/reclaim-chaos.ts.
  RECLAIM_NEVER_OWNED: 'GC-nothing-the-reclaimer-deletes-is-owned-by-an-active-or-fenced-scope',
  // The reclaimer's fault kinds (issue 21): checked by test/chaos/reclaim-checks.ts.
  RECLAIMED_GENERATION_REFUSED: 'K-a-reclaimed-generation-is-refused-a-record-after-its-delete',
  QUIET_FLEET_RECLAIMED: 'Q-a-quiet-fleets-leaks-are-reclaimed-within-grace-plus-two-intervals',
  DETERMINISTIC_ID_RECORDABLE_AFTER_RECLAIM:
    'N-a-reclaimed-deterministic-id-records-again-within-the-delete-window',
} as const;
export type Invariant = (typeof Invariant)[keyof typeof Invariant];

export interface Violation {
  invariant: Invariant;
  /** Stable identity, so a violation found by a periodic check and the final one counts once. */
  key: string;
  message: string;
  details?: Record<string, unknown>;
}

/** One DELETE the provisioner saw (its audit entry), times on this process's clock. */
export interface DeleteRequest {
  seq: number;
  path: string;
  sandboxId: string | undefined;
  generation: number | undefined;
  status: number | undefined;
  outcome: string;
  fault: string | undefined;
  /** How long a 429's Retry-After asked the client to wait, as the provisioner computed it. */
  retryAfterAskedMs?: number | undefined;
  startedAt: number;
  endedAt: number | undefined;
  deletedGeneration: number | undefined;
  /** When the provisioner deleted it: later than `endedAt` if the client gave up first. */
  deletedAt?: number | undefined;
}

export interface CapturedRelease {
  origin: string;
  sentAtMs: number;
  runId: string;
  uid: string;
  runtimeScopeId: string;
  sandboxId: string;
  generation: number;
  fenceSetAt: string | null;
}

/** Ledger rows with `atMs`/`pendingSinceMs` already on this process's clock. */
export interface History {
  runLog: readonly RunLogEntry[];
  sandboxLog: readonly SandboxLogEntry[];
  deletes: readonly DeleteRequest[];
  /** sandbox id → scope key (`scopeKeyText`). */
  sandboxScope: ReadonlyMap<string, string>;
  releases: readonly CapturedRelease[];
  /** The fenceSetAt text of a message (ISO 8601 with offset) on this process's clock. */
  fenceTextToLocalMs: (text: string) => number;
  /** Only events older than this are judged (later ones may not be fully recorded yet). */
  settledBeforeMs: number;
}

export interface CheckCounts {
  clearsChecked: number;
  deletesChecked: number;
  capturesChecked: number;
  deletionsChecked: number;
}

const scopeKey = (entry: { uid: string; runtimeScopeId: string }) =>
  `${entry.uid}\u0000${entry.runtimeScopeId}`;

/**
 * 200/204, 404, or 409 naming a newer generation than `generation`: the generation is gone. For
 * 200/204/404 the status line is the answer, so it counts once the headers were sent even if the
 * body was then cut short (a slow or oversized body the client stopped reading). A 409 says which
 * generation is current only in its body, so it counts only when answered in full.
 */
export function confirmsGone(request: DeleteRequest, generation: number): boolean {
  if (request.status === undefined) return false;
  if (request.outcome !== 'answered' && request.outcome !== 'aborted') return false;
  // An injected 200 (a catch-all server's HTML page at a wrong URL) touched nothing: the status
  // line is not the provisioner's answer, and trusting it would clear a fence over a live sandbox.
  if ((request.status === 200 || request.status === 204) && request.fault?.startsWith('status:'))
    return false;
  // 410 is gone (contract v1.1 §3); the local provisioner answers it only after a real delete.
  if (request.status === 200 || request.status === 204 || request.status === 404 || request.status === 410)
    return true;
  if (request.status !== 409 || request.outcome !== 'answered') return false;
  // A real 409 names the live generation, which is always the newest one ever created (a new one
  // is created only once the old one is gone), so it is newer; an injected one says what it says.
  const injected = /^conflict:(\d+)$/.exec(request.fault ?? '');
  return injected ? Number(injected[1]) > generation : true;
}

interface Indexed {
  runsByRun: Map<string, RunLogEntry[]>;
  runsByScope: Map<string, RunLogEntry[]>;
  sandboxesByScope: Map<string, SandboxLogEntry[]>;
  deletesBySandbox: Map<string, DeleteRequest[]>;
}

function push<K, V>(map: Map<K, V[]>, key: K, value: V): void {
  const list = map.get(key);
  if (list) list.push(value);
  else map.set(key, [value]);
}

function index(history: History): Indexed {
  const byTime = <T extends { atMs: number; seq: number }>(a: T, b: T) => a.atMs - b.atMs || a.seq - b.seq;
  const runsByRun = new Map<string, RunLogEntry[]>();
  const runsByScope = new Map<string, RunLogEntry[]>();
  for (const entry of [...history.runLog].sort(byTime)) {
    push(runsByRun, entry.runId, entry);
    push(runsByScope, scopeKey(entry), entry);
  }
  const sandboxesByScope = new Map<string, SandboxLogEntry[]>();
  for (const entry of [...history.sandboxLog].sort(byTime)) {
    const scope = scopeKey(entry);
    const previous = sandboxesByScope.get(scope)?.at(-1);
    push(sandboxesByScope, scope, withoutInheritedRelease(entry, previous));
  }
  const deletesBySandbox = new Map<string, DeleteRequest[]>();
  for (const request of history.deletes)
    if (request.sandboxId !== undefined) push(deletesBySandbox, request.sandboxId, request);
  return { runsByRun, runsByScope, sandboxesByScope, deletesBySandbox };
}

/**
 * A generation is released only by a write that kept its (sandbox id, generation): finalize marks
 * the generation it confirmed gone. A row that names a new generation and reads released at once
 * inherited the previous generation's `released_at` (issue 11.3; the platform's upsert left it
 * alone): the new generation is live, so it is judged as unreleased — a fence cleared over it
 * without a confirmed delete is then a violation of invariant 1, as it is in production.
 */
export function withoutInheritedRelease(
  entry: SandboxLogEntry,
  previous: SandboxLogEntry | undefined,
): SandboxLogEntry {
  if (!entry.released) return entry;
  const sameGeneration =
    previous !== undefined &&
    previous.sandboxId === entry.sandboxId &&
    previous.generation === entry.generation;
  return sameGeneration ? entry : { ...entry, released: false };
}

/** The scope's recorded sandbox just before `atMs` (ignoring rows written by `exceptTxid`). */
function stateAt(
  entries: readonly SandboxLogEntry[],
  atMs: number,
  exceptTxid?: string,
): SandboxLogEntry | undefined {
  let state: SandboxLogEntry | undefined;
  for (const entry of entries) {
    if (entry.atMs >= atMs) break;
    if (entry.txid !== exceptTxid) state = entry;
  }
  return state;
}

export interface FenceEpoch {
  runId: string;
  /** Ledger seq of the row that raised the fence: a key that does not move with clock estimates. */
  setSeq: number;
  scope: string;
  setAtMs: number;
  setText: string | null;
  clearAtMs: number | undefined;
  clearTxid: string | undefined;
}

/** Each time a run's fence went up, and when (if) it came down again. */
export function fenceEpochs(runsByRun: Map<string, RunLogEntry[]>): FenceEpoch[] {
  const epochs: FenceEpoch[] = [];
  for (const [runId, entries] of runsByRun) {
    let open: FenceEpoch | undefined;
    let previous: RunLogEntry | undefined;
    for (const entry of entries) {
      if (entry.pending && !previous?.pending) {
        open = {
          runId,
          setSeq: entry.seq,
          scope: scopeKey(entry),
          setAtMs: entry.atMs,
          setText: entry.pendingSinceText,
          clearAtMs: undefined,
          clearTxid: undefined,
        };
        epochs.push(open);
      } else if (!entry.pending && previous?.pending && open) {
        open.clearAtMs = entry.atMs;
        open.clearTxid = entry.txid;
        open = undefined;
      }
      previous = entry;
    }
  }
  return epochs;
}

/** Invariants 1, 2a and 2b over a history, with how many things each one checked. */
export function checkSafety(history: History): { violations: Violation[]; counts: CheckCounts } {
  const idx = index(history);
  const fences = checkFenceClearedAfterConfirmedDelete(history, idx);
  const generations = checkOnlyCapturedGenerationDeleted(history, idx);
  const activeRuns = checkNoDeleteUnderActiveRun(history, idx);
  return {
    violations: [...fences.violations, ...generations.violations, ...activeRuns.violations],
    counts: {
      clearsChecked: fences.checked,
      deletesChecked: generations.deletesChecked,
      capturesChecked: generations.capturesChecked,
      deletionsChecked: activeRuns.checked,
    },
  };
}

/** 1: every clear follows a confirmation of each generation its fence guarded. */
function checkFenceClearedAfterConfirmedDelete(
  history: History,
  idx: Indexed,
): { violations: Violation[]; checked: number } {
  const violations: Violation[] = [];
  let checked = 0;
  for (const epoch of fenceEpochs(idx.runsByRun)) {
    if (epoch.clearAtMs === undefined || epoch.clearAtMs >= history.settledBeforeMs) continue;
    checked += 1;
    const sandboxes = idx.sandboxesByScope.get(epoch.scope) ?? [];
    const required = new Map<string, SandboxLogEntry>();
    const atSet = stateAt(sandboxes, epoch.setAtMs);
    if (atSet && !atSet.released) required.set(`${atSet.sandboxId}#${atSet.generation}`, atSet);
    for (const entry of sandboxes) {
      if (entry.atMs <= epoch.setAtMs || entry.atMs >= epoch.clearAtMs || entry.txid === epoch.clearTxid)
        continue;
      if (!entry.released) required.set(`${entry.sandboxId}#${entry.generation}`, entry);
    }
    for (const entry of required.values()) {
      const candidates = idx.deletesBySandbox.get(entry.sandboxId) ?? [];
      const confirmed = candidates.some(
        (request) =>
          request.generation === entry.generation &&
          request.endedAt !== undefined &&
          request.endedAt > epoch.setAtMs &&
          request.endedAt < epoch.clearAtMs! &&
          confirmsGone(request, entry.generation),
      );
      if (confirmed) continue;
      violations.push({
        invariant: Invariant.FENCE_CLEARED_AFTER_CONFIRMED_DELETE,
        key: `1:${epoch.runId}:${epoch.setSeq}:${entry.sandboxId}#${entry.generation}`,
        message: `fence of ${epoch.runId} cleared without a confirmed delete of ${entry.sandboxId} generation ${entry.generation}`,
        details: {
          runId: epoch.runId,
          fenceSetAtMs: epoch.setAtMs,
          fenceClearedAtMs: epoch.clearAtMs,
          sandboxId: entry.sandboxId,
          generation: entry.generation,
          deletesOfThatSandbox: candidates.map(describeDelete),
        },
      });
    }
  }
  return { violations, checked };
}

/** 2a: every DELETE names a (sandbox, generation) a fence check captured, and deletes only that. */
function checkOnlyCapturedGenerationDeleted(
  history: History,
  idx: Indexed,
): { violations: Violation[]; deletesChecked: number; capturesChecked: number } {
  const violations: Violation[] = [];
  let deletesChecked = 0;
  let capturesChecked = 0;
  const capturedPairs = new Map<string, number>();
  for (const release of history.releases) {
    const pair = `${release.sandboxId}#${release.generation}`;
    capturedPairs.set(pair, Math.min(capturedPairs.get(pair) ?? Number.POSITIVE_INFINITY, release.sentAtMs));
  }
  for (const request of history.deletes) {
    if (request.startedAt >= history.settledBeforeMs) continue;
    const scope = request.sandboxId === undefined ? undefined : history.sandboxScope.get(request.sandboxId);
    if (scope === undefined) {
      // A hostile or unknown id: it must not have deleted anything.
      if (request.deletedGeneration !== undefined) {
        violations.push({
          invariant: Invariant.ONLY_CAPTURED_GENERATION_DELETED,
          key: `2a:unknown:${request.seq}`,
          message: `a DELETE of an id no scope owns deleted generation ${request.deletedGeneration}`,
          details: describeDelete(request),
        });
      }
      continue;
    }
    deletesChecked += 1;
    const problems: string[] = [];
    if (request.generation === undefined) problems.push('the DELETE named no generation');
    if (request.deletedGeneration !== undefined && request.deletedGeneration !== request.generation) {
      problems.push(`it deleted generation ${request.deletedGeneration}, not the one it named`);
    }
    const capturedAt = capturedPairs.get(`${request.sandboxId}#${request.generation}`);
    if (capturedAt === undefined || capturedAt > request.startedAt) {
      problems.push('no fence check captured that (sandbox, generation) before the request');
    }
    if (problems.length) {
      violations.push({
        invariant: Invariant.ONLY_CAPTURED_GENERATION_DELETED,
        key: `2a:delete:${request.seq}`,
        message: `DELETE #${request.seq} of ${request.sandboxId}: ${problems.join('; ')}`,
        details: describeDelete(request),
      });
    }
  }
  for (const release of history.releases) {
    if (release.origin !== 'stack' || release.sentAtMs >= history.settledBeforeMs) continue;
    capturesChecked += 1;
    const scope = scopeKey(release);
    const sandboxes = idx.sandboxesByScope.get(scope) ?? [];
    const fenceUp = (idx.runsByRun.get(release.runId) ?? []).some(
      (entry) => entry.pending && sameInstant(entry.pendingSinceText, release.fenceSetAt),
    );
    const fromMs =
      release.fenceSetAt === null ? release.sentAtMs : history.fenceTextToLocalMs(release.fenceSetAt);
    const states = [
      stateAt(sandboxes, fromMs),
      ...sandboxes.filter((e) => e.atMs >= fromMs && e.atMs < release.sentAtMs),
    ];
    const named = states.some(
      (state) =>
        state !== undefined &&
        !state.released &&
        state.sandboxId === release.sandboxId &&
        state.generation === release.generation,
    );
    if (fenceUp && named) continue;
    violations.push({
      invariant: Invariant.ONLY_CAPTURED_GENERATION_DELETED,
      key: `2a:capture:${release.runId}:${release.sandboxId}#${release.generation}:${release.sentAtMs}`,
      message: fenceUp
        ? `release of ${release.runId} names ${release.sandboxId}#${release.generation}, not the scope's generation while its fence was up`
        : `release of ${release.runId} was published for a fence (${release.fenceSetAt}) that never existed`,
      details: { ...release },
    });
  }
  return { violations, deletesChecked, capturesChecked };
}

/** 2b: no sandbox was deleted while a run of its scope was not terminal. */
function checkNoDeleteUnderActiveRun(
  history: History,
  idx: Indexed,
): { violations: Violation[]; checked: number } {
  const violations: Violation[] = [];
  let checked = 0;
  const activeIntervals = new Map<string, Array<{ runId: string; from: number; to: number }>>();
  for (const [runId, entries] of idx.runsByRun) {
    const first = entries[0]!;
    const terminal = entries.find((entry) => TERMINAL.has(entry.status));
    const from = NON_TERMINAL.has(first.status) ? first.atMs : undefined;
    if (from === undefined) continue;
    push(activeIntervals, scopeKey(first), { runId, from, to: terminal?.atMs ?? Number.POSITIVE_INFINITY });
  }
  for (const request of history.deletes) {
    if (request.deletedGeneration === undefined || request.startedAt >= history.settledBeforeMs) continue;
    const scope = request.sandboxId === undefined ? undefined : history.sandboxScope.get(request.sandboxId);
    if (scope === undefined) continue;
    checked += 1;
    // A DELETE carried out after its client gave up acts until it deleted, not until it ended.
    const end = Math.max(request.endedAt ?? history.settledBeforeMs, request.deletedAt ?? 0);
    const overlapping = (activeIntervals.get(scope) ?? []).filter(
      (interval) => interval.from < end && interval.to > request.startedAt,
    );
    if (overlapping.length === 0) continue;
    violations.push({
      invariant: Invariant.NO_DELETE_UNDER_ACTIVE_RUN,
      key: `2b:${request.seq}`,
      message: `${request.sandboxId} generation ${request.deletedGeneration} deleted while run(s) ${overlapping
        .map((i) => i.runId)
        .join(', ')} of its scope were not terminal`,
      details: { delete: describeDelete(request), activeRuns: overlapping },
    });
  }
  return { violations, checked };
}

// The statuses as the database defines them (infra/run-statuses.ts reads runtime_cleanup_status_is_active).
const TERMINAL = new Set<string>(TERMINAL_RUN_STATUSES);
const NON_TERMINAL = new Set<string>(NON_TERMINAL_RUN_STATUSES);

function describeDelete(request: DeleteRequest): Record<string, unknown> {
  return {
    seq: request.seq,
    path: request.path,
    generation: request.generation,
    status: request.status,
    outcome: request.outcome,
    fault: request.fault,
    startedAt: request.startedAt,
    endedAt: request.endedAt,
    deletedGeneration: request.deletedGeneration,
    deletedAt: request.deletedAt,
  };
}

/** When each root run's fence last came down, and the start of its convergence clock. */
export interface ConvergenceSample {
  runId: string;
  /** Fence set → clear, whatever happened in between. */
  fenceToClearMs: number;
  /**
   * From the later of: fence set, the run's faults stopped, its scope's last run turned terminal,
   * the end of the last stack-wide fault that began before the clear.
   */
  convergenceMs: number;
  /** The fence was still up when that clock started (else it cleared while faults still fired). */
  fencedWhenFaultsStopped: boolean;
}

/**
 * Invariant 4's measurement: for each root run of a chaos run, the time from "nothing stands in
 * the way any more" to the fence's last clear.
 */
export function convergenceOf(
  runLog: readonly RunLogEntry[],
  runs: ReadonlyArray<{ rootRunIds: readonly string[]; faultsStoppedAtMs: number }>,
  /**
   * Faults that hit the whole stack at once (a termination storm, connects that never answer),
   * from their start to when their effect ends: they are every run's faults, so a fence's clock
   * starts after the last one that began before it cleared.
   */
  stackWide: ReadonlyArray<{ startMs: number; endMs: number }> = [],
): { samples: ConvergenceSample[]; uncleared: string[] } {
  const idx = index({
    runLog,
    sandboxLog: [],
    deletes: [],
    sandboxScope: new Map(),
    releases: [],
    fenceTextToLocalMs: () => 0,
    settledBeforeMs: Number.POSITIVE_INFINITY,
  });
  const epochs = fenceEpochs(idx.runsByRun);
  const lastEpoch = new Map<string, FenceEpoch>();
  for (const epoch of epochs) lastEpoch.set(epoch.runId, epoch);
  // When each run of a scope became terminal (its first terminal row; later rows, such as the
  // fence's clear, keep the status and are not transitions).
  const terminalAt = new Map<string, number[]>();
  for (const entries of idx.runsByRun.values()) {
    const first = entries.find((entry) => TERMINAL.has(entry.status));
    if (first) push(terminalAt, scopeKey(first), first.atMs);
  }
  const samples: ConvergenceSample[] = [];
  const uncleared: string[] = [];
  for (const run of runs) {
    for (const runId of run.rootRunIds) {
      const epoch = lastEpoch.get(runId);
      if (!epoch) continue;
      if (epoch.clearAtMs === undefined) {
        uncleared.push(runId);
        continue;
      }
      const lastTerminal = Math.max(
        ...(terminalAt.get(epoch.scope) ?? []).filter((atMs) => atMs <= epoch.clearAtMs!),
      );
      const lastStackWide = Math.max(
        ...stackWide.filter((episode) => episode.startMs < epoch.clearAtMs!).map((episode) => episode.endMs),
      );
      const start = Math.max(epoch.setAtMs, run.faultsStoppedAtMs, lastTerminal, lastStackWide);
      samples.push({
        runId,
        fenceToClearMs: epoch.clearAtMs - epoch.setAtMs,
        convergenceMs: Math.max(0, epoch.clearAtMs - start),
        fencedWhenFaultsStopped: epoch.clearAtMs > start,
      });
    }
  }
  return { samples, uncleared };
}

export function percentile(values: readonly number[], p: number): number {
  return nearestRank(ascending(values), p) ?? 0;
}

const SANDBOX_PATH = /^\/api\/sandboxes\/([^/]+)$/;

/**
 * Security check S1 over every DELETE the provisioner saw (hostile ids included): the path is the
 * collection plus exactly one segment, and that segment percent-decodes to the id the request was
 * about — no `/`, `?`, `#` or dot-segment of an id ever reached the URL structure.
 */
export function checkPathsEncoded(deletes: readonly DeleteRequest[]): {
  violations: Violation[];
  checked: number;
} {
  const violations: Violation[] = [];
  for (const request of deletes) {
    const segment = SANDBOX_PATH.exec(request.path)?.[1];
    let decoded: string | undefined;
    try {
      decoded = segment === undefined ? undefined : decodeURIComponent(segment);
    } catch {
      decoded = undefined;
    }
    const ok = segment !== undefined && segment !== '.' && segment !== '..' && decoded === request.sandboxId;
    if (ok) continue;
    violations.push({
      invariant: Invariant.IDS_PERCENT_ENCODED,
      key: `S1:${request.seq}`,
      message: `DELETE #${request.seq} went to ${JSON.stringify(request.path.slice(0, 120))}, not one encoded segment of its sandbox id`,
      details: describeDelete(request),
    });
  }
  return { violations, checked: deletes.length };
}

/**
 * Two fence times as instants, to the microsecond: the text of a timestamptz depends on the
 * rendering session's TimeZone (and, in the older `::text` form, DateStyle), so equal instants may
 * be spelled differently. Compared as epoch milliseconds plus the sub-millisecond digits.
 */
export function sameInstant(a: string | null, b: string | null): boolean {
  if (a === null || b === null) return a === b;
  return instantKey(a) === instantKey(b);
}

function instantKey(text: string): string {
  const iso = text.replace(' ', 'T').replace(/([+-]\d\d)$/, '$1:00');
  const fraction = /\.(\d+)/.exec(iso)?.[1] ?? '';
  const ms = Date.parse(iso);
  return Number.isNaN(ms) ? text : `${ms}.${fraction.padEnd(6, '0').slice(3, 6)}`;
}
