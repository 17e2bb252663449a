/**
 * What the engine records while the runs execute, each on its own interval: the provisioner's
 * audit (copied out, so nothing is lost past its own limit), the runtime-cleaned events, the
 * clock alignment between the database and this process, and the periodic safety checks that
 * catch a violation while it happens (they judge only events a few seconds old, which are fully
 * recorded by then).
 */
import type { SQSClient } from '@aws-sdk/client-sqs';
import type { AuditEntry, LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import { type ClockSync, preciseNow } from './clock.ts';
import { buildHistory } from './history.ts';
import { checkSafety, type DeleteRequest, type History, type Violation } from './invariants.ts';
import type { LedgerReader } from './ledger.ts';
import { type MessageLog, runIdOf, takeAll } from './message-log.ts';
import type { ScopePool } from './platform-ops.ts';

/** A commit may still be on its way for events younger than this; the periodic checks skip them. */
const UNSETTLED_MS = 5_000;

export interface RecorderSources {
  provisioner: LocalProvisioner;
  sqs: SQSClient;
  cleanedQueueUrl: string;
  clock: ClockSync;
  ledger: LedgerReader;
  messages: MessageLog;
  scopes: ScopePool;
  /** Violations found elsewhere (the DELETE probe), kept with the periodic checks' own. */
  otherViolations: () => readonly Violation[];
  /** Reclaimer hook (issue 13): the reclaimer's DELETEs, judged by invariant GC instead of 2a/2b. */
  isReclaimDelete?: (request: DeleteRequest) => boolean;
  onError: (message: string) => void;
}

export class Recorders {
  readonly audit = new Map<number, AuditEntry>();
  /** runId → runtime-cleaned events received. */
  readonly cleaned = new Map<string, number>();
  /** Violations the periodic checks found while the runs executed, by key. */
  readonly found = new Map<string, Violation & { foundAtMs: number }>();
  readonly #timers: NodeJS.Timeout[] = [];
  #recording: Promise<unknown> = Promise.resolve();

  constructor(private readonly sources: RecorderSources) {}

  start(): void {
    this.#every(500, async () => this.collectAudit());
    this.#every(1_000, () => this.drainCleaned());
    this.#every(2_000, () => this.sources.clock.sample());
    this.#every(250, async () => this.sources.clock.sampleWall());
    this.#every(5_000, () => this.#checkNow());
  }

  collectAudit(): void {
    for (const entry of this.sources.provisioner.audit()) this.audit.set(entry.seq, entry);
  }

  async drainCleaned(): Promise<void> {
    for (const message of await takeAll(this.sources.sqs, this.sources.cleanedQueueUrl)) {
      const runId = runIdOf(message.Body ?? '');
      if (runId) this.cleaned.set(runId, (this.cleaned.get(runId) ?? 0) + 1);
    }
  }

  history(settledBeforeMs: number): History {
    const { ledger, clock, messages, scopes, isReclaimDelete } = this.sources;
    const history = buildHistory({ ledger, clock, audit: this.audit, messages, scopes, settledBeforeMs });
    // Reclaimer hook (issue 13): its DELETEs follow no fence check by design (reclaim-chaos.ts).
    return isReclaimDelete
      ? { ...history, deletes: history.deletes.filter((request) => !isReclaimDelete(request)) }
      : history;
  }

  /** Stops the intervals (idempotent); resolves when the recording they started has finished. */
  async stop(): Promise<void> {
    for (const timer of this.#timers) clearInterval(timer);
    this.#timers.length = 0;
    await this.#recording;
  }

  #every(ms: number, work: () => Promise<unknown>): void {
    const timer = setInterval(() => {
      this.#recording = Promise.all([
        this.#recording,
        work().catch((error: Error) => this.sources.onError(error.message)),
      ]);
    }, ms);
    this.#timers.push(timer);
  }

  async #checkNow(): Promise<void> {
    await this.sources.ledger.poll();
    this.collectAudit();
    const { violations } = checkSafety(this.history(preciseNow() - UNSETTLED_MS));
    for (const violation of [...violations, ...this.sources.otherViolations()]) {
      if (!this.found.has(violation.key))
        this.found.set(violation.key, { ...violation, foundAtMs: preciseNow() });
    }
  }
}
