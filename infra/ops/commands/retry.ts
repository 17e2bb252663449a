/**
 * `retry <runId>`: announces a fenced run on `run-finished` again, as the sweeper would, without
 * waiting for FENCE_SWEEP_AFTER_SECONDS. The protocol itself decides what happens: phase 1
 * re-checks everything under the locks, so a retry can never clear a fence it should not.
 */
import { announceRunFinished } from '../../../functions/adapters/publish.ts';
import { QueueName } from '../../../functions/adapters/queues.ts';
import { ErrorCode, OperationRefusedError, RunNotFoundError } from '../../../functions/cleanup/errors.ts';
import { RunType } from '../../../functions/cleanup/types.ts';
import type { Command } from '../command.ts';

const RUN_FENCE = 'SELECT run_type, runtime_cleanup_pending FROM agent_runs WHERE id = $1::text';

export const retryCommand: Command = {
  name: 'retry',
  arguments: [{ name: 'runId' }],
  summary: 'announce a fenced run on run-finished again (cleanup restarts at phase 1)',
  options: {},
  async run(input, context) {
    const runId = input.positionals[0]!;
    const db = await context.database();
    // A read: safe to send again after a lost connection (Database.query does, once).
    const { rows } = await db.query<{ run_type: string; runtime_cleanup_pending: boolean }>(RUN_FENCE, [
      runId,
    ]);
    const run = rows[0];
    if (!run) throw new RunNotFoundError(runId);
    if (run.run_type === RunType.SUBAGENT) {
      throw new OperationRefusedError(
        ErrorCode.RUN_NOT_ROOT,
        `run ${JSON.stringify(runId)} is a subagent run; only root runs own a cleanup`,
        { runId },
      );
    }
    if (!run.runtime_cleanup_pending) {
      throw new OperationRefusedError(
        ErrorCode.FENCE_NOT_PENDING,
        `run ${JSON.stringify(runId)} has no pending fence; there is nothing to retry`,
        { runId },
      );
    }
    const messageId = await announceRunFinished(context.queues(), runId, { reason: 'operator_retry' });
    return {
      result: { runId, queue: QueueName.RUN_FINISHED, messageId },
      text: `Announced run ${runId} on ${QueueName.RUN_FINISHED} (message ${messageId}); follow it with: npm run ops -- explain ${runId}`,
    };
  },
};
