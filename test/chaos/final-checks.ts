/**
 * The final judgement, once every fault stopped and the system drained: the safety invariants over
 * the whole history (1, 2a, 2b), convergence (4), nothing lost (5), no sandbox left behind (1b)
 * and percent-encoded ids (S1), merged with what the periodic checks and the DELETE probe found.
 */
import type { Message, SQSClient } from '@aws-sdk/client-sqs';
import type { Database } from '../../functions/adapters/database.ts';
import { deadLetterQueueName } from '../../functions/adapters/queues.ts';
import type { LocalProvisioner, SandboxInfo } from '../../infra/local/provisioner/server.ts';
import {
  type CheckCounts,
  type ConvergenceSample,
  checkPathsEncoded,
  checkSafety,
  convergenceOf,
  type History,
  Invariant,
  type Violation,
} from './invariants.ts';
import { type MessageLog, runIdOf, takeAll } from './message-log.ts';
import { checkNothingLost } from './nothing-lost.ts';
import type { ConsumedQueue } from './plan.ts';
import type { ScopePool } from './platform-ops.ts';
import { checkForgedReleases, checkProvisionerReplies, deadLetterFacts } from './production-checks.ts';
import type { ProductionFaultState } from './production-faults.ts';
import type { RunRecord } from './run-driver.ts';
import { CONSUMED_QUEUES, CONVERGENCE_BOUND_MS } from './settings.ts';

const LIST_FENCES = 'SELECT id FROM agent_runs WHERE runtime_cleanup_pending ORDER BY id';
const EXPLAIN_FENCE = `
  SELECT status, runtime_cleanup_pending, runtime_cleanup_pending_since::text AS pending_since,
         runtime_cleanup_announced_at::text AS announced_at
  FROM agent_runs WHERE id = $1::text`;

export interface FinalVerdict {
  /** Every violation, each once (by key). */
  violations: Violation[];
  counts: CheckCounts;
  convergence: { samples: ConvergenceSample[]; uncleared: string[] };
  nothingLost: ReturnType<typeof checkNothingLost>;
  paths: { checked: number };
  deadLetters: Map<ConsumedQueue, Message[]>;
  /** Sandboxes still live, and those among them no lying answer explains. */
  live: SandboxInfo[];
  leaks: SandboxInfo[];
  /** Distinct (sandbox, generation) pairs ever recorded. */
  sandboxesCreated: number;
  /**
   * How many things each invariant judged outside the fixed set above (the invariants of issue 11
   * and any added later): the report's table reads it, so a new invariant needs only its entry in
   * `Invariant`, its count here and its violations in `violations`.
   */
  extraChecks: Partial<Record<Invariant, number>>;
}

/** An invariant judged elsewhere (a watcher, an episode), handed in with its count. */
export interface JudgedElsewhere {
  invariant: Invariant;
  checked: number;
  violations: readonly Violation[];
}

export async function judgeFinalHistory(input: {
  history: History;
  earlier: readonly Violation[];
  runRecords: readonly RunRecord[];
  drained: boolean;
  admin: Database;
  sqs: SQSClient;
  queueUrl: (name: string) => string;
  messages: MessageLog;
  cleaned: ReadonlyMap<string, number>;
  scopes: ScopePool;
  provisioner: LocalProvisioner;
  production: ProductionFaultState;
  retryCapMs: number;
  judgedElsewhere: readonly JudgedElsewhere[];
  /** Stack-wide episodes (db-episodes.ts), on this process's clock. */
  stackWideFaults: ReadonlyArray<{ startMs: number; endMs: number }>;
}): Promise<FinalVerdict> {
  const { history, admin, messages, scopes } = input;
  const deadLetters = new Map<ConsumedQueue, Message[]>();
  for (const queue of CONSUMED_QUEUES) {
    deadLetters.set(queue, await takeAll(input.sqs, input.queueUrl(deadLetterQueueName(queue))));
  }
  const safety = checkSafety(history);
  const violations = new Map<string, Violation>();
  for (const violation of [...input.earlier, ...safety.violations]) violations.set(violation.key, violation);

  // 4: convergence
  const convergence = convergenceOf(history.runLog, input.runRecords, input.stackWideFaults);
  for (const sample of convergence.samples) {
    if (sample.convergenceMs <= CONVERGENCE_BOUND_MS) continue;
    violations.set(`4:${sample.runId}`, {
      invariant: Invariant.CONVERGENCE,
      key: `4:${sample.runId}`,
      message: `fence of ${sample.runId} took ${Math.round(sample.convergenceMs)} ms to clear after its faults stopped (bound ${CONVERGENCE_BOUND_MS} ms)`,
      details: { ...sample },
    });
  }
  for (const runId of convergence.uncleared) {
    violations.set(`4:${runId}`, {
      invariant: Invariant.CONVERGENCE,
      key: `4:${runId}`,
      message: `fence of ${runId} never cleared`,
      details: { runId, ...(await explainFence(admin, messages, deadLetters, runId)) },
    });
  }

  // 5: nothing lost
  const nothingLost = checkNothingLost({
    drained: input.drained,
    messages,
    deadLetters,
    cleaned: new Map(input.cleaned),
    runLog: history.runLog,
    stillFenced: (await admin.query<{ id: string }>(LIST_FENCES)).rows.map((row) => row.id),
    audit: history.deletes,
  });
  for (const violation of nothingLost.violations) violations.set(violation.key, violation);

  // 1b: no sandbox left behind, except the ones a lying answer was expected to leave
  const expectedLeakSandboxes = new Set(
    scopes.all.filter((scope) => scope.retired).flatMap((scope) => [...scope.sandboxIds]),
  );
  const live = input.provisioner.liveSandboxes();
  // A decoy (a sandbox no scope owns, named by forged releases) must stay live: invariant G.
  const leaks = live.filter(
    (sandbox) => !expectedLeakSandboxes.has(sandbox.id) && !input.production.decoys.has(sandbox.id),
  );
  for (const sandbox of leaks) {
    violations.set(`1b:${sandbox.id}#${sandbox.generation}`, {
      invariant: Invariant.NO_SANDBOX_LEAKED,
      key: `1b:${sandbox.id}#${sandbox.generation}`,
      message: `sandbox ${sandbox.id} generation ${sandbox.generation} is still live although every fence is down`,
      details: {
        sandboxId: sandbox.id,
        generation: sandbox.generation,
        scope: scopes.scopeOfSandbox(sandbox.id),
        deletes: history.deletes.filter((d) => d.sandboxId === sandbox.id),
        recorded: history.sandboxLog.filter((e) => e.sandboxId === sandbox.id),
      },
    });
  }

  // S1: every request path the provisioner saw carried its sandbox id as one encoded segment.
  const paths = checkPathsEncoded(history.deletes);
  for (const violation of paths.violations) violations.set(violation.key, violation);

  // G and R: the forged releases, and the provisioner replies of contract v1.1 §3.
  const extraChecks: Partial<Record<Invariant, number>> = {};
  const releaseDeadLetters = (deadLetters.get('runtime-release.fifo') ?? []).map(deadLetterFacts);
  const forged = checkForgedReleases({
    forged: input.production.forged,
    releaseDeadLetters,
    acked: messages.acked,
    decoys: input.production.decoys,
    liveSandboxIds: new Set(live.map((sandbox) => sandbox.id)),
    protocolDeletes: history.deletes,
  });
  const replies = checkProvisionerReplies({
    releaseDeadLetters,
    deletes: history.deletes,
    retryCapMs: input.retryCapMs,
  });
  const judged: JudgedElsewhere[] = [
    { invariant: Invariant.FORGED_RELEASES_REFUSED, ...forged },
    { invariant: Invariant.PROVISIONER_REPLIES_HONOURED, ...replies },
    ...input.judgedElsewhere,
  ];
  for (const { invariant, checked, violations: found } of judged) {
    extraChecks[invariant] = (extraChecks[invariant] ?? 0) + checked;
    for (const violation of found) violations.set(violation.key, violation);
  }

  return {
    violations: [...violations.values()],
    extraChecks,
    counts: safety.counts,
    convergence,
    nothingLost,
    paths,
    deadLetters,
    live,
    leaks,
    sandboxesCreated: new Set(history.sandboxLog.map((e) => `${e.sandboxId}#${e.generation}`)).size,
  };
}

/** For a fence that never cleared: what is (or is not) on its way to it. */
async function explainFence(
  admin: Database,
  messages: MessageLog,
  deadLetters: Map<ConsumedQueue, Message[]>,
  runId: string,
): Promise<Record<string, unknown>> {
  const { rows } = await admin.query(EXPLAIN_FENCE, [runId]);
  return {
    row: rows[0],
    messagesSent: messages
      .messagesOf(runId)
      .map((m) => ({ queue: m.queue, origin: m.origin, acked: messages.acked.has(m.messageId) })),
    deadLetters: [...deadLetters.entries()].flatMap(([queue, list]) =>
      list
        .filter((message) => runIdOf(message.Body ?? '') === runId)
        .map((message) => ({ queue, errorCode: message.MessageAttributes?.errorCode?.StringValue })),
    ),
  };
}
