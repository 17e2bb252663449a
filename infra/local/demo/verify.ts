/**
 * The ground truth behind the exit code: what the database, the provisioner, the process table,
 * the file system and the dead-letter queues say, independently of any log line.
 */
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { GetQueueAttributesCommand, type SQSClient } from '@aws-sdk/client-sqs';
import type { Executor } from '../../../functions/adapters/database.ts';
import {
  deadLetterQueueName,
  QUEUE_DEFINITIONS,
  type QueueName,
} from '../../../functions/adapters/queues.ts';
import { isProcessAlive, type LocalProvisioner } from '../provisioner/server.ts';
import type { CreatedQueue } from '../queue-setup.ts';
import type { LeakedSandbox, SandboxRecord } from './workload.ts';

/** Root runs of the demo's users that still carry the fence, oldest first. */
const PENDING_FENCES = `
  SELECT id, status, extract(epoch FROM now() - runtime_cleanup_pending_since)::float8 AS pending_seconds
  FROM agent_runs
  WHERE uid LIKE $1::text AND run_type <> 'subagent' AND runtime_cleanup_pending
  ORDER BY runtime_cleanup_pending_since`;

const NON_TERMINAL_RUNS = `
  SELECT count(*)::int AS count FROM agent_runs
  WHERE uid LIKE $1::text AND status IN ('pending', 'running', 'cancel_requested')`;

export interface PendingFence {
  runId: string;
  status: string;
  pendingSeconds: number;
}

export async function pendingFences(db: Executor, uidPrefix: string): Promise<PendingFence[]> {
  const { rows } = await db.query<{ id: string; status: string; pending_seconds: number | null }>(
    PENDING_FENCES,
    [`${likeEscape(uidPrefix)}%`],
  );
  return rows.map((row) => ({ runId: row.id, status: row.status, pendingSeconds: row.pending_seconds ?? 0 }));
}

export interface GroundTruth {
  pendingFences: PendingFence[];
  nonTerminalRuns: number;
  /** Sandboxes of this demo the provisioner still has (built-in: its registry; external: GET). */
  liveSandboxes: string[];
  /** Sandbox processes of this demo still running (built-in provisioner only). */
  aliveProcesses: number[];
  /** Sandbox work directories of this demo still on disk (built-in provisioner only). */
  leftoverDirectories: string[];
  /** Whether the processes and directories could be checked (the built-in provisioner). */
  processesChecked: boolean;
  /** Scopes where a run reused a sandbox generation: a run admitted while the old runtime lived. */
  reusedGenerations: string[];
  /** Messages in each dead-letter queue (visible and in flight). */
  deadLetterQueues: Record<string, number>;
  /** The sandboxes the workload leaked on purpose that the provisioner still has (not reclaimed). */
  leakedStillLive: string[];
}

export interface GroundTruthSources {
  db: Executor;
  uidPrefix: string;
  sandboxes: readonly SandboxRecord[];
  /** The sandboxes the workload leaked on purpose (the reclaimer's to delete). */
  leaked?: readonly LeakedSandbox[];
  provisioner: LocalProvisioner | undefined;
  provisionerUrl: string;
  /** SANDBOX_PROVISIONER_TOKEN, for an external provisioner that requires it. */
  provisionerToken?: string | undefined;
  sqs: SQSClient;
  createdQueues: ReadonlyMap<string, CreatedQueue>;
}

export async function groundTruth(sources: GroundTruthSources): Promise<GroundTruth> {
  const { db, uidPrefix, sandboxes, provisioner } = sources;
  const [fences, nonTerminal, live, deadLetterQueues] = await Promise.all([
    pendingFences(db, uidPrefix),
    db.query<{ count: number }>(NON_TERMINAL_RUNS, [`${likeEscape(uidPrefix)}%`]),
    liveSandboxesOf(sources),
    deadLetterCounts(sources.sqs, sources.createdQueues),
  ]);
  const leakedStillLive = await liveSandboxIds(
    sources,
    (sources.leaked ?? []).map((leak) => leak.sandboxId),
  );
  const aliveProcesses = sandboxes
    .filter((sandbox) => sandbox.pid !== undefined && isProcessAlive(sandbox.pid))
    .map((sandbox) => sandbox.pid!);
  const leftoverDirectories = provisioner ? await leftoverDirectoriesOf(provisioner.rootDir, sandboxes) : [];
  return {
    pendingFences: fences,
    nonTerminalRuns: nonTerminal.rows[0]?.count ?? 0,
    liveSandboxes: live,
    aliveProcesses,
    leftoverDirectories,
    processesChecked: provisioner !== undefined,
    reusedGenerations: reusedGenerations(sandboxes),
    deadLetterQueues,
    leakedStillLive,
  };
}

/** Only the pids, for after the stack stopped: no sandbox process may outlive the demo. */
export function survivingProcesses(sandboxes: readonly SandboxRecord[]): number[] {
  return sandboxes.filter((s) => s.pid !== undefined && isProcessAlive(s.pid)).map((s) => s.pid!);
}

async function liveSandboxesOf(sources: GroundTruthSources): Promise<string[]> {
  return liveSandboxIds(
    sources,
    sources.sandboxes.map((sandbox) => sandbox.sandboxId),
  );
}

/** Which of these sandbox ids the provisioner still has. */
export async function liveSandboxIds(
  sources: Pick<GroundTruthSources, 'provisioner' | 'provisionerUrl' | 'provisionerToken'>,
  sandboxIds: readonly string[],
): Promise<string[]> {
  const ids = new Set(sandboxIds);
  if (sources.provisioner) {
    return sources.provisioner
      .liveSandboxes()
      .filter((sandbox) => ids.has(sandbox.id))
      .map((sandbox) => sandbox.id);
  }
  // An external provisioner: ask it about each sandbox (docs/integration.md §3: GET answers 404 once gone).
  const live: string[] = [];
  for (const id of ids) {
    const response = await fetch(
      `${sources.provisionerUrl.replace(/\/+$/, '')}/api/sandboxes/${encodeURIComponent(id)}`,
      sources.provisionerToken ? { headers: { authorization: `Bearer ${sources.provisionerToken}` } } : {},
    );
    await response.body?.cancel();
    if (response.status !== 404) live.push(id);
  }
  return live;
}

async function leftoverDirectoriesOf(
  rootDir: string,
  sandboxes: readonly SandboxRecord[],
): Promise<string[]> {
  const known = sandboxes.flatMap((sandbox) => (sandbox.dir && existsSync(sandbox.dir) ? [sandbox.dir] : []));
  // Also any directory of one of the demo's sandbox ids that the records missed.
  const prefixes = new Set(sandboxes.map((sandbox) => sandbox.sandboxId.replace(/[^A-Za-z0-9_-]/g, '_')));
  const entries = existsSync(rootDir) ? await readdir(rootDir) : [];
  const unrecorded = entries
    .filter((entry) => [...prefixes].some((prefix) => entry.startsWith(`${prefix}-`)))
    .map((entry) => `${rootDir}/${entry}`)
    .filter((path) => !known.includes(path));
  return [...known, ...unrecorded];
}

function reusedGenerations(sandboxes: readonly SandboxRecord[]): string[] {
  const seen = new Map<string, Set<number>>();
  const reused: string[] = [];
  for (const sandbox of sandboxes) {
    const key = `${sandbox.uid}:${sandbox.runtimeScopeId}`;
    const generations = seen.get(key) ?? new Set<number>();
    if (generations.has(sandbox.generation)) reused.push(`${key} generation ${sandbox.generation}`);
    generations.add(sandbox.generation);
    seen.set(key, generations);
  }
  return reused;
}

/** Messages in each dead-letter queue of the stack (visible and in flight). */
export async function deadLetterCounts(
  sqs: SQSClient,
  createdQueues: ReadonlyMap<string, CreatedQueue>,
): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (const [name, definition] of Object.entries(QUEUE_DEFINITIONS) as Array<
    [QueueName, { consumer: string | null }]
  >) {
    if (!definition.consumer) continue;
    const dlq = deadLetterQueueName(name);
    const url = createdQueues.get(dlq)?.url;
    if (!url) continue;
    const { Attributes } = await sqs.send(
      new GetQueueAttributesCommand({
        QueueUrl: url,
        AttributeNames: ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible'],
      }),
    );
    counts[dlq] =
      Number(Attributes?.ApproximateNumberOfMessages ?? 0) +
      Number(Attributes?.ApproximateNumberOfMessagesNotVisible ?? 0);
  }
  return counts;
}

/** LIKE treats `_` and `%` as wildcards; the prefix is matched literally. */
function likeEscape(value: string): string {
  return value.replace(/[\\%_]/g, (character) => `\\${character}`);
}
