/**
 * `redrive <queue>`: moves the queue's dead letters back to it, through SQS's message move task
 * where the endpoint has one, else by receive → send → delete. Safe to repeat: every consumer is
 * idempotent, and a letter that fails again is simply dead-lettered again with its new reason.
 */
import type { Command } from '../command.ts';
import { CONSUMED_QUEUES, resolveConsumedQueue } from '../dead-letters.ts';
import { plural } from '../format.ts';
import { RedriveMethod, redriveDeadLetters } from '../redrive-dead-letters.ts';

/** How long to watch a message move task before reporting it as still running. */
const MOVE_TASK_WAIT_MS = 30_000;

export const redriveCommand: Command = {
  name: 'redrive',
  arguments: [{ name: 'queue' }],
  summary: `move dead letters back to their queue (${CONSUMED_QUEUES.join(', ')})`,
  options: {},
  async run(input, context) {
    const queue = resolveConsumedQueue(input.positionals[0]!);
    const result = await redriveDeadLetters(context.queues(), queue, { waitForTaskMs: MOVE_TASK_WAIT_MS });
    const how =
      result.method === RedriveMethod.MESSAGE_MOVE_TASK
        ? `by SQS message move task ${result.taskHandle} (${result.taskStatus})`
        : 'by receive, send, delete (this endpoint has no message move task)';
    const lines = [
      `Moved ${plural(result.moved, 'message')} from ${result.deadLetterQueue} to ${queue} ${how}.`,
    ];
    if (result.skipped) {
      lines.push(`Left ${plural(result.skipped, 'letter')} that failed again during this redrive.`);
    }
    if (result.taskStatus === 'RUNNING') lines.push('The task is still running: check again with `dlq`.');
    return { result, text: lines.join('\n') };
  },
};
