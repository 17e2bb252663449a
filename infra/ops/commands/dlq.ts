/**
 * `dlq`: per consumed queue, how many dead letters wait in its DLQ and why, grouped by error code
 * and reason. The count is GetQueueAttributes' visible plus in-flight messages, taken before our
 * own peek: a letter someone is peeking or redriving at this instant is in flight, yet still in
 * the DLQ. The peek lists every letter it can receive (dead-letters.ts) and says when the listing
 * may be incomplete.
 */
import { deadLetterQueueName, type QueueName } from '../../../functions/adapters/queues.ts';
import type { Command } from '../command.ts';
import {
  CONSUMED_QUEUES,
  groupReasons,
  peekDeadLetters,
  queueDepth,
  type ReasonCount,
} from '../dead-letters.ts';
import { orDash, renderTable } from '../format.ts';

export interface DeadLetterQueueReport {
  queue: QueueName;
  deadLetterQueue: string;
  /** Letters in the DLQ: `visible + inFlight`. */
  messages: number;
  /** ApproximateNumberOfMessages. */
  visible: number;
  /** ApproximateNumberOfMessagesNotVisible: being peeked or redriven right now. */
  inFlight: number;
  /** Letters the peek saw: all of them unless `complete` is false. */
  peeked: number;
  complete: boolean;
  /** Why the listing may lack letters (hidden by someone else, behind a FIFO group's head, a cap). */
  incompleteBecause: string | null;
  reasons: ReasonCount[];
}

export const dlqCommand: Command = {
  name: 'dlq',
  arguments: [],
  summary: 'dead letters per queue: counts and reasons (peeked, never consumed)',
  options: {},
  async run(_input, context) {
    const queues = context.queues();
    const reports: DeadLetterQueueReport[] = await Promise.all(
      CONSUMED_QUEUES.map(async (queue) => {
        const deadLetterQueue = deadLetterQueueName(queue);
        const depth = await queueDepth(queues, deadLetterQueue);
        const messages = depth.visible + depth.inFlight;
        const peek =
          messages > 0
            ? await peekDeadLetters(queues, queue)
            : { letters: [], complete: true, incompleteBecause: null };
        return {
          queue,
          deadLetterQueue,
          messages,
          visible: depth.visible,
          inFlight: depth.inFlight,
          peeked: peek.letters.length,
          complete: peek.complete,
          incompleteBecause: peek.incompleteBecause,
          reasons: groupReasons(peek.letters),
        };
      }),
    );
    const total = reports.reduce((sum, report) => sum + report.messages, 0);
    const lines = [
      renderTable(
        ['DEAD-LETTER QUEUE', 'MESSAGES', 'OF WHICH IN FLIGHT'],
        reports.map((r) => [r.deadLetterQueue, String(r.messages), String(r.inFlight)]),
      ),
    ];
    for (const report of reports.filter((r) => r.reasons.length || !r.complete)) {
      lines.push(
        '',
        `${report.deadLetterQueue}${report.complete ? '' : ` (the listing may be incomplete: ${report.incompleteBecause})`}`,
      );
      lines.push(
        renderTable(
          ['COUNT', 'ERROR CODE', 'REASON'],
          report.reasons.map((reason) => [
            String(reason.count),
            orDash(reason.errorCode),
            orDash(reason.reason),
          ]),
        ),
      );
    }
    if (total > 0) lines.push('', 'Move them back once the cause is fixed: npm run ops -- redrive <queue>');
    return { result: { queues: reports, total }, text: lines.join('\n') };
  },
};
