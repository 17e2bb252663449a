/**
 * Every message the system and the chaos suite send, every acknowledgement the event sources
 * make, and the process-crash faults that sit on those two seams:
 *
 * - a *crash at a step boundary* makes one send throw, as if the process died just before it (the
 *   effect before it — a commit, a delete — has happened, the message that announces it is never
 *   sent); the whole invocation then loses its acknowledgements, so the other records of the batch
 *   come back too (a crash mid-batch);
 * - a *crash before the ack* drops the deletion of a record whose handler finished: it comes back
 *   after the visibility timeout, a duplicate of work already done.
 */
import {
  DeleteMessageBatchCommand,
  GetQueueAttributesCommand,
  type Message,
  ReceiveMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { Queues, SendOptions } from '../../functions/adapters/queues.ts';
import type { AckInvocation } from '../../infra/local/event-source.ts';
import { preciseNow } from './clock.ts';
import { type ConsumerFunction, FaultKind } from './plan.ts';

export type MessageOrigin = 'stack' | 'platform' | 'replay' | 'hostile' | 'forged';

export interface SentMessage {
  queue: string;
  messageId: string;
  body: string;
  runId: string | undefined;
  options: SendOptions;
  sentAtMs: number;
  origin: MessageOrigin;
}

/** Thrown by a send the chaos suite chose as a crash point; the batch treats it as unexpected. */
export class SimulatedCrashError extends Error {
  constructor(readonly boundary: FaultKind) {
    super(`simulated process crash at ${boundary}`);
    this.name = 'SimulatedCrashError';
  }
}

export type CrashBoundary =
  | typeof FaultKind.CRASH_BEFORE_RELEASE_PUBLISH
  | typeof FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH
  | typeof FaultKind.CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED;

/** Which function sends the message a boundary guards, so its invocation is the one that crashes. */
const CRASHING_FUNCTION: Record<CrashBoundary, ConsumerFunction> = {
  [FaultKind.CRASH_BEFORE_RELEASE_PUBLISH]: 'fence-check',
  [FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH]: 'release',
  [FaultKind.CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED]: 'finalize',
};

export function runIdOf(body: string): string | undefined {
  try {
    const value = (JSON.parse(body) as { runId?: unknown } | null)?.runId;
    return typeof value === 'string' ? value : undefined;
  } catch {
    return undefined;
  }
}

function boundaryOf(queue: string, body: string): CrashBoundary | undefined {
  if (queue === 'runtime-release.fifo') return FaultKind.CRASH_BEFORE_RELEASE_PUBLISH;
  if (queue === 'runtime-cleaned') return FaultKind.CRASH_AFTER_FINALIZE_COMMIT_BEFORE_CLEANED;
  if (queue === 'runtime-finalize') {
    // Only the release function's publish follows a delete; the fence check's 'nothing_to_delete'
    // and the finalize function's deferred re-sends (with `deferrals`) are other boundaries.
    try {
      const parsed = JSON.parse(body) as { releaseOutcome?: string; deferrals?: number };
      if (parsed.releaseOutcome !== 'nothing_to_delete' && parsed.deferrals === undefined) {
        return FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH;
      }
    } catch {}
  }
  return undefined;
}

export class MessageLog {
  readonly sent = new Map<string, SentMessage>();
  readonly acked = new Set<string>();
  /** Faults injected, by kind (some kinds carry a `:detail`, e.g. which function lost its ack). */
  readonly injected = new Map<string, number>();
  /** runId → messages sent about it, in send order (for replays). */
  readonly #byRun = new Map<string, SentMessage[]>();
  readonly #armedCrashes = new Map<string, Set<CrashBoundary>>();
  readonly #crashes: Array<{ runId: string; fn: ConsumerFunction; atMs: number }> = [];
  readonly #droppedAcks = new Map<string, ConsumerFunction[]>();
  /** Crash points hit per run (the run driver reads them to know the fault fired). */
  readonly crashesHit = new Map<string, number>();
  /** `runId boundary` of every crash that fired. */
  readonly #crashed = new Set<string>();
  /** Finalize publishes held after the DELETE, by run: see holdAfterDelete. */
  readonly #holds = new Map<string, { reached: () => void; released: Promise<void> }>();
  /** Called after every send, crash and dropped acknowledgement: see `until`. */
  readonly #onChange = new Set<() => void>();

  count(kind: FaultKind | `${FaultKind}:${string}`, by = 1): void {
    this.injected.set(kind, (this.injected.get(kind) ?? 0) + by);
  }

  armCrash(runId: string, boundary: CrashBoundary): void {
    const armed = this.#armedCrashes.get(runId) ?? new Set();
    armed.add(boundary);
    this.#armedCrashes.set(runId, armed);
  }

  dropAck(runId: string, fn: ConsumerFunction): void {
    this.#droppedAcks.set(runId, [...(this.#droppedAcks.get(runId) ?? []), fn]);
  }

  /** The run's fault window closed: nothing armed for it fires any more. */
  disarm(runId: string): void {
    this.#armedCrashes.delete(runId);
    this.#droppedAcks.delete(runId);
  }

  hasCrashed(runId: string, boundary: CrashBoundary): boolean {
    return this.#crashed.has(`${runId} ${boundary}`);
  }

  /** Acknowledgements still to be dropped for the run (dropAck arms them; each fires once). */
  dropsLeft(runId: string): number {
    return this.#droppedAcks.get(runId)?.length ?? 0;
  }

  /**
   * Holds the release function's finalize publish of `runId` — the moment after its DELETE
   * succeeded and before phase 3 can run — until `release` is called: what the platform does in
   * between (re-provisioning the sandbox) then happens at that moment by construction, not by
   * timing. `reached` resolves when a publish is being held. Call `release` in every case.
   */
  holdAfterDelete(runId: string): { reached: Promise<void>; release: () => void } {
    let reached!: () => void;
    let release!: () => void;
    const reachedPromise = new Promise<void>((resolve) => {
      reached = resolve;
    });
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    this.#holds.set(runId, { reached, released });
    return {
      reached: reachedPromise,
      release: () => {
        this.#holds.delete(runId);
        release();
      },
    };
  }

  /**
   * Resolves true once `check` holds — checked now and after every send, crash and dropped
   * acknowledgement, the events a fault of this log waits for — or false after `timeoutMs`.
   */
  until(check: () => boolean, timeoutMs: number): Promise<boolean> {
    if (check()) return Promise.resolve(true);
    return new Promise((resolve) => {
      const onChange = () => {
        if (!check()) return;
        finish(true);
      };
      const finish = (result: boolean) => {
        clearTimeout(timer);
        this.#onChange.delete(onChange);
        resolve(result);
      };
      const timer = setTimeout(() => finish(false), timeoutMs);
      this.#onChange.add(onChange);
    });
  }

  #changed(): void {
    for (const listener of [...this.#onChange]) listener();
  }

  messagesOf(runId: string): readonly SentMessage[] {
    return this.#byRun.get(runId) ?? [];
  }

  /** A Queues that records what it sends; with `crashes`, the armed crash points fire in it. */
  wrap(inner: Queues, origin: MessageOrigin, options: { crashes?: boolean } = {}): Queues {
    const send = async (queue: string, body: unknown, sendOptions: SendOptions = {}): Promise<string> => {
      const text = typeof body === 'string' ? body : JSON.stringify(body);
      const runId = runIdOf(text);
      if (options.crashes && runId !== undefined) {
        this.#maybeCrash(queue, text, runId);
        await this.#maybeHold(queue, text, runId);
      }
      // Taken before the send: its consumer may act on the message before the send resolves here.
      const sentAtMs = preciseNow();
      const messageId = await inner.send(queue, body, sendOptions);
      this.record({ queue, messageId, body: text, runId, options: sendOptions, sentAtMs, origin });
      return messageId;
    };
    return { ...inner, send };
  }

  record(message: SentMessage): void {
    this.sent.set(message.messageId, message);
    if (message.runId !== undefined) {
      const list = this.#byRun.get(message.runId) ?? [];
      list.push(message);
      this.#byRun.set(message.runId, list);
    }
    this.#changed();
  }

  /** The event sources' `beforeAck` hook: applies crash and dropped-ack faults, records the rest. */
  readonly beforeAck = (invocation: AckInvocation): Message[] => {
    const fn = invocation.functionName as ConsumerFunction;
    const runIds = invocation.messages.map((message) => runIdOf(message.Body ?? ''));
    const crashed = this.#crashes.some(
      (crash) => crash.fn === fn && crash.atMs >= invocation.invokedAt && runIds.includes(crash.runId),
    );
    if (crashed) {
      if (invocation.messages.length > 1) this.count(FaultKind.CRASH_MID_BATCH);
      return [];
    }
    const kept: Message[] = [];
    for (const message of invocation.toDelete) {
      const runId = runIdOf(message.Body ?? '');
      const drops = runId === undefined ? undefined : this.#droppedAcks.get(runId);
      const index = drops?.indexOf(fn) ?? -1;
      if (drops && index >= 0) {
        drops.splice(index, 1);
        this.count(`${FaultKind.CRASH_BEFORE_ACK}:${fn}`);
        continue;
      }
      kept.push(message);
    }
    for (const message of kept) this.acked.add(message.MessageId!);
    if (kept.length < invocation.toDelete.length) this.#changed();
    return kept;
  };

  #maybeCrash(queue: string, body: string, runId: string): void {
    const boundary = boundaryOf(queue, body);
    const armed = this.#armedCrashes.get(runId);
    if (!boundary || !armed?.delete(boundary)) return;
    this.#crashes.push({ runId, fn: CRASHING_FUNCTION[boundary], atMs: Date.now() });
    this.crashesHit.set(runId, (this.crashesHit.get(runId) ?? 0) + 1);
    this.#crashed.add(`${runId} ${boundary}`);
    this.count(boundary);
    this.#changed();
    throw new SimulatedCrashError(boundary);
  }

  async #maybeHold(queue: string, body: string, runId: string): Promise<void> {
    if (boundaryOf(queue, body) !== FaultKind.CRASH_AFTER_DELETE_BEFORE_FINALIZE_PUBLISH) return;
    const hold = this.#holds.get(runId);
    if (!hold) return;
    hold.reached();
    await hold.released;
  }
}

/** Queue depth: visible, in flight and delayed messages. */
export async function queueDepth(sqs: SQSClient, queueUrl: string): Promise<number> {
  const { Attributes } = await sqs.send(
    new GetQueueAttributesCommand({
      QueueUrl: queueUrl,
      AttributeNames: [
        'ApproximateNumberOfMessages',
        'ApproximateNumberOfMessagesNotVisible',
        'ApproximateNumberOfMessagesDelayed',
      ],
    }),
  );
  return (
    Number(Attributes?.ApproximateNumberOfMessages ?? 0) +
    Number(Attributes?.ApproximateNumberOfMessagesNotVisible ?? 0) +
    Number(Attributes?.ApproximateNumberOfMessagesDelayed ?? 0)
  );
}

/** Receives every message on a queue and deletes them (runtime-cleaned, DLQs at the end). */
export async function takeAll(sqs: SQSClient, queueUrl: string): Promise<Message[]> {
  const taken: Message[] = [];
  for (;;) {
    const { Messages } = await sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: queueUrl,
        MaxNumberOfMessages: 10,
        WaitTimeSeconds: 0,
        VisibilityTimeout: 120,
        MessageAttributeNames: ['All'],
        MessageSystemAttributeNames: ['All'],
      }),
    );
    if (!Messages?.length) return taken;
    taken.push(...Messages);
    await sqs.send(
      new DeleteMessageBatchCommand({
        QueueUrl: queueUrl,
        Entries: Messages.map((message, index) => ({
          Id: String(index),
          ReceiptHandle: message.ReceiptHandle!,
        })),
      }),
    );
  }
}
