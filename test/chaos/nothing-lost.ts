/**
 * Invariant 5, nothing lost: judged once the system drained, from every message sent, every
 * acknowledgement, the dead-letter queues' contents, the runtime-cleaned events and the fences
 * still up.
 */
import type { Message } from '@aws-sdk/client-sqs';
import { expectedFate, FATE_CODES } from './hostile.ts';
import { type DeleteRequest, Invariant, type Violation } from './invariants.ts';
import type { MessageLog } from './message-log.ts';
import type { ConsumedQueue } from './plan.ts';
import { CONSUMED_QUEUES } from './settings.ts';

/**
 * Invariant 5: every message sent to a consumed queue was taken off it (processed, or dead-lettered
 * by the function with its reason); every dead letter carries a reason and an error code and came
 * from a message that was sent; no fence is left up; every cleared fence was announced on
 * runtime-cleaned at least once; every hostile message met the fate its body calls for.
 */
export function checkNothingLost(input: {
  drained: boolean;
  messages: MessageLog;
  deadLetters: Map<ConsumedQueue, Message[]>;
  cleaned: Map<string, number>;
  runLog: readonly { runId: string; runType: string; pending: boolean }[];
  stillFenced: string[];
  audit: readonly DeleteRequest[];
}): { violations: Violation[]; checked: number; messageCounts: Record<string, number> } {
  const { messages, deadLetters } = input;
  const violations: Violation[] = [];
  const lost = (key: string, message: string, details?: Record<string, unknown>) =>
    violations.push({
      invariant: Invariant.NOTHING_LOST,
      key: `5:${key}`,
      message,
      ...(details ? { details } : {}),
    });
  let checked = 0;

  if (!input.drained)
    lost(
      'drain',
      'the system did not drain (fences, queue depth or unacknowledged messages) before the deadline',
    );
  for (const runId of input.stillFenced) {
    checked += 1;
    lost(`fenced:${runId}`, `run ${runId} is still fenced at the end`);
  }
  const consumed = [...messages.sent.values()].filter((m) =>
    (CONSUMED_QUEUES as readonly string[]).includes(m.queue),
  );
  const deadLettered = new Map<string, { queue: ConsumedQueue; errorCode: string | undefined }>();
  const redriven: Array<{ queue: ConsumedQueue; messageId: string }> = [];
  for (const [queue, list] of deadLetters) {
    for (const letter of list) {
      checked += 1;
      const attributes = letter.MessageAttributes ?? {};
      const source = attributes.sourceMessageId?.StringValue;
      const reason = attributes.reason?.StringValue;
      const errorCode = attributes.errorCode?.StringValue;
      if (!reason || !errorCode || !source) {
        // SQS's own redrive (past maxReceiveCount) keeps the message id and adds no reason.
        redriven.push({ queue, messageId: letter.MessageId! });
        continue;
      }
      if (!messages.sent.has(source)) {
        lost(
          `orphan:${letter.MessageId}`,
          `dead letter ${letter.MessageId} names a source message nobody sent`,
          { source },
        );
      }
      deadLettered.set(source, { queue, errorCode });
    }
  }
  // A redriven copy is acceptable only beside a copy with its reason: the function dead-lettered
  // the message on its last allowed receive, then a crash lost the acknowledgement, and SQS moved
  // the original too. A redriven message with no reasoned copy was parked without a reason.
  let redrivenAfterReasonedCopy = 0;
  for (const { queue, messageId } of redriven) {
    if (deadLettered.has(messageId)) {
      redrivenAfterReasonedCopy += 1;
      continue;
    }
    lost(
      `reasonless:${messageId}`,
      `message ${messageId} reached the ${queue} DLQ with no reason (SQS redrive)`,
    );
  }
  for (const message of consumed) {
    checked += 1;
    if (messages.acked.has(message.messageId) || deadLettered.has(message.messageId)) continue;
    lost(
      `unacked:${message.messageId}`,
      `message ${message.messageId} on ${message.queue} was neither processed nor dead-lettered with a reason`,
      {
        queue: message.queue,
        origin: message.origin,
        runId: message.runId,
      },
    );
  }
  const clearedRoots = new Set<string>();
  for (const entry of input.runLog) {
    if (entry.runType !== 'subagent' && !entry.pending) clearedRoots.add(entry.runId);
  }
  const everFenced = new Set(input.runLog.filter((e) => e.pending).map((e) => e.runId));
  for (const runId of everFenced) {
    if (!clearedRoots.has(runId) || input.stillFenced.includes(runId)) continue;
    checked += 1;
    if (!input.cleaned.has(runId))
      lost(`cleaned:${runId}`, `run ${runId} was cleared but never announced on runtime-cleaned`);
  }
  let hostile = 0;
  for (const message of consumed) {
    if (message.origin !== 'hostile') continue;
    hostile += 1;
    checked += 1;
    const fate = expectedFate(message.queue as ConsumedQueue, message.body);
    const letter = deadLettered.get(message.messageId);
    if (letter && FATE_CODES[fate].includes(letter.errorCode ?? '')) continue;
    lost(
      `hostile:${message.messageId}`,
      `a hostile message on ${message.queue} was not dead-lettered as ${FATE_CODES[fate].join(' or ')}`,
      {
        got: letter ?? null,
        body: message.body.slice(0, 200),
      },
    );
  }
  return {
    violations,
    checked,
    messageCounts: {
      sentToConsumedQueues: consumed.length,
      acknowledged: consumed.filter((m) => messages.acked.has(m.messageId)).length,
      deadLettered: [...deadLetters.values()].reduce((sum, list) => sum + list.length, 0),
      replayed: consumed.filter((m) => m.origin === 'replay').length,
      hostile,
      runtimeCleanedEvents: [...input.cleaned.values()].reduce((sum, n) => sum + n, 0),
      redrivenCopiesBesideAReasonedOne: redrivenAfterReasonedCopy,
      deletesSeenByProvisioner: input.audit.length,
    },
  };
}
