/**
 * `force-clear <runId> --reason "<text>" [--yes] [--actor <name>]`: clears a fence without a
 * confirmed delete (functions/cleanup/force-clear.ts: same locks and re-checks as the protocol,
 * audited in the same transaction). Without `--yes` it only says what it would do.
 *
 * A forced clear is never silent: the audit row (which the deployed sweeper counts as the
 * ForcedClears metric), `runtime-cleaned` with `forced: true`, a WARN log line; and the operator
 * is told which sandbox generation may still exist, since nobody confirmed its deletion.
 */
import { userInfo } from 'node:os';
import { publishCleaned } from '../../../functions/adapters/publish.ts';
import { QueueName } from '../../../functions/adapters/queues.ts';
import { ErrorCode, isCleanupError, OperationRefusedError } from '../../../functions/cleanup/errors.ts';
import {
  type ForceClearPlan,
  type ForceClearResult,
  forceClear,
} from '../../../functions/cleanup/force-clear.ts';
import { type Command, stringOption } from '../command.ts';
import type { OpsContext } from '../context.ts';
import { ScopeBlockedError, UsageError } from '../errors.ts';
import { ExitCode } from '../exit-codes.ts';
import { describeFailure } from '../failure.ts';
import { EARLIER_ATTEMPT_WINDOW_SECONDS, type EarlierAttempt, findEarlierAttempt } from '../forced-clears.ts';
import { isoTime } from '../format.ts';

export interface ForceClearOutput {
  applied: boolean;
  runId: string;
  uid: string;
  runtimeScopeId: string;
  status: string;
  fenceSetAt: string | null;
  reason: string;
  actor: string;
  /** The generation that may still exist at the provisioner (null: the scope had none live). */
  sandbox: { sandboxId: string; generation: number } | null;
  overrideId: number | null;
  forcedAt: string | null;
  /** The `runtime-cleaned` event sent; null on a dry run or when it could not be sent. */
  published: { queue: string; messageId: string } | null;
  /**
   * True when this invocation found the fence already cleared by this operator's own earlier
   * attempt (same actor and reason, its answer lost: a COMMIT whose reply never came, retried by
   * the driver or by the operator) and finished that attempt's work: publishing.
   */
  alreadyCleared: boolean;
}

/**
 * `forceClear`, and when it answers "no pending fence" to an applying call, the audit row of this
 * operator's earlier attempt if there is one: the clear happened, only its answer was lost.
 */
async function clearOrRecognise(
  db: Awaited<ReturnType<OpsContext['database']>>,
  request: { runId: string; reason: string; actor: string; apply: boolean },
): Promise<{ outcome: ForceClearResult; alreadyCleared: boolean }> {
  try {
    const outcome = await forceClear(db, { ...request, dryRun: !request.apply });
    return { outcome, alreadyCleared: false };
  } catch (error) {
    if (!request.apply || !isCleanupError(error) || error.code !== ErrorCode.FENCE_NOT_PENDING) throw error;
    // forceClear stores the trimmed text: compare with that.
    const earlier = await findEarlierAttempt(db, {
      runId: request.runId,
      actor: request.actor.trim(),
      reason: request.reason.trim(),
    });
    if (!earlier) throw error;
    if (earlier.blockedBy) throw blockedRefusal(request.runId, earlier);
    const plan: ForceClearPlan = {
      runId: request.runId,
      uid: earlier.uid,
      runtimeScopeId: earlier.runtimeScopeId,
      status: earlier.status,
      fenceSetAt: earlier.fenceSetAt,
      sandboxId: earlier.sandboxId,
      generation: earlier.generation,
      reason: request.reason.trim(),
      actor: request.actor.trim(),
    };
    return {
      outcome: { applied: true, plan, overrideId: earlier.overrideId, forcedAt: earlier.forcedAt },
      alreadyCleared: true,
    };
  }
}

/**
 * The earlier clear happened, but the scope is blocked NOW, where forceClear itself would refuse
 * (exit 4): "cleaned" is not announced. Once the scope is unblocked the announcement comes from
 * whatever unblocks it (the release's finalize), not from here.
 */
function blockedRefusal(runId: string, earlier: EarlierAttempt): Error {
  const done = `your earlier attempt did force-clear the fence of run ${JSON.stringify(runId)} (override #${earlier.overrideId} at ${earlier.forcedAt}), but ${QueueName.RUNTIME_CLEANED} is not announced:`;
  const context = {
    runId,
    uid: earlier.uid,
    runtimeScopeId: earlier.runtimeScopeId,
    overrideId: earlier.overrideId,
  };
  const block = earlier.blockedBy!;
  if (block.kind === 'delete_in_flight') {
    return new OperationRefusedError(
      ErrorCode.DELETE_IN_FLIGHT,
      `${done} a DELETE of sandbox ${block.sandboxId} generation ${block.generation} (the release of run ${block.releaseRunId}) ` +
        `may still be in flight for the scope until ${block.until}. Nothing to redo: that release's cleanup announces the scope when it ends.`,
      {
        ...context,
        deleteInFlightUntil: block.until,
        deleteInFlightRunId: block.releaseRunId,
        sandboxId: block.sandboxId,
        generation: block.generation,
      },
    );
  }
  return new ScopeBlockedError(
    `${done} another root run of scope ${earlier.uid} / ${earlier.runtimeScopeId} has a pending fence, so the scope is not clean. ` +
      `Nothing to redo: that run's cleanup announces the scope when it ends (\`npm run ops -- fences\` lists it).`,
  );
}

function actorOf(explicit: string | undefined, env: OpsContext['env']): string {
  if (explicit !== undefined) return explicit;
  if (env.USER?.trim()) return env.USER;
  try {
    return userInfo().username;
  } catch {
    return '';
  }
}

function sandboxOf(plan: ForceClearPlan): ForceClearOutput['sandbox'] {
  return plan.sandboxId !== null && plan.generation !== null
    ? { sandboxId: plan.sandboxId, generation: plan.generation }
    : null;
}

/**
 * What the operator must know about the sandbox the fence was for. No raw `DELETE` is printed any
 * more: once the fence is down a run may be admitted and handed that very sandbox (the platform's
 * provisioner reuses a live container, and its DELETE ignores the generation), so a hand-sent
 * DELETE can remove a running run's sandbox.
 */
function leftBehindLines(output: ForceClearOutput): string[] {
  if (!output.sandbox) return ['The scope had no live sandbox generation: nothing can be left behind.'];
  const { sandboxId, generation } = output.sandbox;
  return [
    `Sandbox ${sandboxId} generation ${generation} was not confirmed deleted. It stays recorded as the scope's live`,
    "sandbox (not released), so the scope's next cleanup deletes it: another fenced run's, or the next run's when it ends.",
    'Until then the provisioner may hand it to a run admitted to the scope.',
    'Do not delete it by hand with a DELETE to the provisioner: a run admitted since may be using it.',
  ];
}

export const forceClearCommand: Command = {
  name: 'force-clear',
  arguments: [{ name: 'runId' }],
  summary: 'clear a fence by hand, audited (dry run unless --yes)',
  details: [
    'Re-checks under the scope lock that the run is a terminal root run with a pending fence, that',
    'no run is active in its scope and that no release DELETE may still be in flight for it (exit 4',
    'with the time it may end, otherwise); then clears that one fence and writes an audit row, in one',
    'transaction. The sandbox generation stays recorded as live: the next cleanup of the scope deletes',
    'it. Publishes runtime-cleaned with forced: true.',
    `Run again after a lost answer (same --reason and actor, within ${EARLIER_ATTEMPT_WINDOW_SECONDS / 60} minutes), it recognises`,
    'its own earlier clear by the audit row and finishes it: publishes, exit 0; unless the fence was',
    'raised again since (exit 1, no pending fence), or the scope is blocked now by a delete in flight',
    'or another fence (exit 4, the clear stands, nothing announced).',
  ].join('\n'),
  options: {
    reason: {
      type: 'string',
      value: 'text',
      description: 'why (required; kept in the audit, at most 500 characters)',
    },
    yes: { type: 'boolean', description: 'apply it; without this flag nothing is changed' },
    actor: { type: 'string', value: 'name', description: 'who (default: $USER, else the login name)' },
  },
  async run(input, context) {
    const runId = input.positionals[0]!;
    const reason = stringOption(input, 'reason');
    if (reason === undefined) {
      throw new UsageError(
        `force-clear needs --reason "<why>": every forced clear is audited with its reason`,
      );
    }
    const actor = actorOf(stringOption(input, 'actor'), context.env);
    const apply = input.options.yes === true;
    const db = await context.database();
    if (apply) {
      // Resolve the queue before clearing, so an unreachable SQS stops us before anything changes.
      await context.queues().url(QueueName.RUNTIME_CLEANED);
    }

    const { outcome, alreadyCleared } = await clearOrRecognise(db, { runId, reason, actor, apply });
    const { plan } = outcome;
    const output: ForceClearOutput = {
      applied: outcome.applied,
      runId,
      uid: plan.uid,
      runtimeScopeId: plan.runtimeScopeId,
      status: plan.status,
      fenceSetAt: isoTime(plan.fenceSetAt),
      reason: plan.reason,
      actor: plan.actor,
      sandbox: sandboxOf(plan),
      overrideId: outcome.applied ? outcome.overrideId : null,
      forcedAt: outcome.applied ? outcome.forcedAt : null,
      published: null,
      alreadyCleared,
    };
    const identity = `run ${runId} (${plan.status}; scope ${plan.uid} / ${plan.runtimeScopeId}; fence set at ${output.fenceSetAt ?? '-'})`;

    if (!outcome.applied) {
      const lines = [
        `Dry run: nothing was changed. With --yes, force-clear would, in one transaction under the scope's lock:`,
        `  - clear the fence of ${identity}`,
        `  - record the override: actor ${JSON.stringify(actor)}, reason ${JSON.stringify(plan.reason)}`,
        `then publish ${QueueName.RUNTIME_CLEANED} with forced: true.`,
        ...leftBehindLines(output),
      ];
      return { result: output, text: lines.join('\n') };
    }

    // The ForcedClears metric is counted deployed-side, by the sweeper, from the audit row: this
    // process writes to a terminal, which CloudWatch never reads.
    const telemetry = context.telemetry();
    telemetry.logger.warn(
      alreadyCleared
        ? "forced clear found done by this operator's earlier attempt"
        : 'fence force-cleared by an operator',
      {
        runId,
        uid: plan.uid,
        runtimeScopeId: plan.runtimeScopeId,
        sandboxId: plan.sandboxId,
        generation: plan.generation,
        actor: plan.actor,
        reason: plan.reason,
        overrideId: output.overrideId,
      },
    );
    let publishFailure: ReturnType<typeof describeFailure> | undefined;
    try {
      const messageId = await publishCleaned(context.queues(), {
        runId,
        uid: plan.uid,
        runtimeScopeId: plan.runtimeScopeId,
        generation: plan.generation,
        cleanedAt: output.forcedAt!,
        forced: true,
      });
      output.published = { queue: QueueName.RUNTIME_CLEANED, messageId };
    } catch (error) {
      publishFailure = describeFailure(error);
    }
    const lines = [
      alreadyCleared
        ? `Already done: your earlier attempt force-cleared the fence of ${identity} (its answer was lost); published now.`
        : `Force-cleared the fence of ${identity}.`,
      `  audit      override #${output.overrideId} at ${output.forcedAt} by ${JSON.stringify(actor)}: ${plan.reason}`,
      output.published
        ? `  published  ${QueueName.RUNTIME_CLEANED} (forced: true), message ${output.published.messageId}`
        : `  published  NOTHING: ${QueueName.RUNTIME_CLEANED} could not be sent`,
      ...leftBehindLines(output),
    ];
    return {
      result: output,
      text: lines.join('\n'),
      ...(publishFailure
        ? {
            exitCode: ExitCode.UNREACHABLE,
            warning: `the fence is cleared and audited (override #${output.overrideId}), but ${QueueName.RUNTIME_CLEANED} was not published: ${publishFailure.message}`,
          }
        : {}),
    };
  },
};
