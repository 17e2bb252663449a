/**
 * The smoke check a team runs after a deploy: the whole cleanup, end to end, through what was
 * deployed. Done the way the platform does it (infra/local/platform.ts): a conversation, a root run
 * admitted in a fresh scope, its sandbox created at the provisioner and recorded, the run finished
 * with its fence in the same statement and announced on run-finished. Then it waits for that run's
 * runtime-cleaned event and checks that it holds: the fence is down, the generation released, the
 * sandbox gone from the provisioner's listing.
 *
 * It shares the stage's runtime-cleaned queue with whoever else consumes it (the platform's
 * worker): it deletes only its own event and hands every other message straight back (visibility
 * 0). If another consumer takes its event first, the wait times out and the report says that the
 * fence did come down. Its rows stay in the database under the uid `smoke-check` (a finished run
 * with a cleared fence changes nothing).
 */
import { randomUUID } from 'node:crypto';
import { DeleteMessageCommand, ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import type { Database } from '../../functions/adapters/database.ts';
import { QueueUnavailableError } from '../../functions/adapters/errors.ts';
import { parseMessage, RuntimeCleanedEvent } from '../../functions/adapters/messages.ts';
import { QueueName, type Queues } from '../../functions/adapters/queues.ts';
import { PlatformSimulator } from '../local/platform.ts';
import { createOpsContext } from '../ops/context.ts';
import { SmokeCheckFailedError } from './errors.ts';
import type { SmokeTarget } from './target.ts';

export const SMOKE_UID = 'smoke-check';

/** SQS's longest long poll is 20 s; shorter keeps the deadline and the progress lines close. */
const POLL_SECONDS = 5;
/** Long enough to look at a message and hand it back before anyone else would see it. */
const LOOK_VISIBILITY_SECONDS = 30;

export interface SmokeResult {
  runId: string;
  uid: string;
  runtimeScopeId: string;
  sandboxId: string;
  generation: number;
  /** The sandbox was created at the provisioner (else only recorded). */
  createdAtProvisioner: boolean;
  /** From the announcement on run-finished to runtime-cleaned. */
  cleanedAfterMs: number;
  event: RuntimeCleanedEvent;
  /** Other consumers' messages seen on runtime-cleaned and handed back. */
  handedBack: number;
}

type Env = Readonly<Record<string, string | undefined>>;

export async function runSmokeCheck(
  target: SmokeTarget,
  options: { env: Env; timeoutMs: number; log: (line: string) => void },
): Promise<SmokeResult> {
  const { DATABASE_URL_PARAMETER: _notReadHere, ...rest } = options.env;
  const context = createOpsContext({
    ...rest,
    DATABASE_URL: target.databaseUrl,
    AWS_ENDPOINT_URL_SQS: target.sqsEndpoint ?? '',
    QUEUE_NAME_PREFIX: target.queueNamePrefix,
  });
  const { log } = options;
  try {
    log(
      `stage ${target.stage}: queues ${target.queueNamePrefix}*, SQS ${context.describe.sqs}, database ${context.describe.database}, provisioner ${target.provisionerUrl ?? '(not reachable from here: the sandbox is only recorded)'}`,
    );
    const db = await context.database();
    const queues = context.queues();
    // Resolved before anything is written: a missing queue (wrong stage, wrong prefix) fails here.
    const cleanedUrl = await queues.url(QueueName.RUNTIME_CLEANED);
    await queues.url(QueueName.RUN_FINISHED);

    const platform = new PlatformSimulator(db, queues, target.provisionerUrl ?? 'http://provisioner.invalid');
    const scope = await platform.createScope(SMOKE_UID);
    const run = await platform.admitRootRun(scope, {
      workerId: 'smoke-check',
      ...(target.provisionerUrl
        ? {}
        : { recordedSandbox: { sandboxId: `smoke-${randomUUID()}`, generation: 1 } }),
    });
    if (!run)
      throw new SmokeCheckFailedError(`the new scope ${scope.runtimeScopeId} refused a run: is it fenced?`);
    log(
      `recorded run ${run.runId}: scope ${scope.runtimeScopeId}, sandbox ${run.sandboxId} generation ${run.generation}`,
    );
    const announcedAt = Date.now();
    await platform.finishRun(run.runId, 'completed');
    log(`finished it with its fence and announced it on ${target.queueNamePrefix}${QueueName.RUN_FINISHED}`);

    const deadline = announcedAt + options.timeoutMs;
    const waited = await awaitCleaned(queues, cleanedUrl, run.runId, deadline, log);
    if (!waited.event) {
      throw new SmokeCheckFailedError(
        `no runtime-cleaned event for run ${run.runId} within ${Math.round(options.timeoutMs / 1000)} s: ${await diagnose(db, run.runId)}`,
      );
    }
    const cleanedAfterMs = Date.now() - announcedAt;
    log(`runtime-cleaned for ${run.runId} after ${(cleanedAfterMs / 1000).toFixed(1)} s`);
    await assertCleaned(db, run, target.provisionerUrl);
    return {
      runId: run.runId,
      uid: scope.uid,
      runtimeScopeId: scope.runtimeScopeId,
      sandboxId: run.sandboxId,
      generation: run.generation,
      createdAtProvisioner: target.provisionerUrl !== undefined,
      cleanedAfterMs,
      event: waited.event,
      handedBack: waited.handedBack,
    };
  } finally {
    await context.close();
  }
}

/** The run's own event, deleted; every other message handed back at once. */
async function awaitCleaned(
  queues: Queues,
  queueUrl: string,
  runId: string,
  deadline: number,
  log: (line: string) => void,
): Promise<{ event: RuntimeCleanedEvent | undefined; handedBack: number }> {
  let handedBack = 0;
  let found: RuntimeCleanedEvent | undefined;
  let nextProgress = Date.now() + 30_000;
  while (!found && Date.now() < deadline) {
    const waitSeconds = Math.max(0, Math.min(POLL_SECONDS, Math.floor((deadline - Date.now()) / 1000)));
    const { Messages: messages = [] } = await sqsCall('ReceiveMessage', () =>
      queues.client.send(
        new ReceiveMessageCommand({
          QueueUrl: queueUrl,
          MaxNumberOfMessages: 10,
          WaitTimeSeconds: waitSeconds,
          VisibilityTimeout: LOOK_VISIBILITY_SECONDS,
        }),
      ),
    );
    for (const message of messages) {
      const event = cleanedEventOf(message.Body ?? '');
      if (event?.runId === runId && !found) {
        found = event;
        await sqsCall('DeleteMessage', () =>
          queues.client.send(
            new DeleteMessageCommand({ QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle }),
          ),
        );
      } else {
        await queues.changeVisibility(QueueName.RUNTIME_CLEANED, message.ReceiptHandle!, 0);
        handedBack += 1;
      }
    }
    if (!found && Date.now() >= nextProgress) {
      log(`still waiting for runtime-cleaned (${Math.round((deadline - Date.now()) / 1000)} s left)`);
      nextProgress += 30_000;
    }
  }
  return { event: found, handedBack };
}

function cleanedEventOf(body: string): RuntimeCleanedEvent | undefined {
  try {
    return parseMessage(RuntimeCleanedEvent, body);
  } catch {
    return undefined;
  }
}

async function sqsCall<T>(operation: string, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    throw new QueueUnavailableError(
      `SQS ${operation} on ${QueueName.RUNTIME_CLEANED} failed: ${(error as Error).name}: ${(error as Error).message}`,
      { queue: QueueName.RUNTIME_CLEANED, operation },
      { cause: error },
    );
  }
}

interface CleanupState {
  pending: boolean;
  releasedAt: string | null;
}

async function cleanupState(db: Database, runId: string): Promise<CleanupState | undefined> {
  const { rows } = await db.query<{ pending: boolean; released_at: string | null }>(
    `SELECT r.runtime_cleanup_pending AS pending, s.released_at::text AS released_at
       FROM agent_runs r
       LEFT JOIN sandbox_runtimes s ON s.uid = r.uid AND s.runtime_scope_id = r.runtime_scope_id
      WHERE r.id = $1::text`,
    [runId],
  );
  const row = rows[0];
  return row ? { pending: row.pending, releasedAt: row.released_at } : undefined;
}

/** Why the event did not come: the cleanup is stuck, or someone else took the event. */
async function diagnose(db: Database, runId: string): Promise<string> {
  const state = await cleanupState(db, runId);
  if (state?.pending) {
    return `its fence is still up, so the cleanup has not finished; look at \`npm run ops -- explain ${runId}\`, the functions' log groups and the dead-letter queues`;
  }
  return 'its fence is down, so the cleanup finished, but the event was not seen here: another consumer of runtime-cleaned (the platform’s worker?) took it';
}

async function assertCleaned(
  db: Database,
  run: { runId: string; sandboxId: string; generation: number },
  provisionerUrl: string | undefined,
): Promise<void> {
  const state = await cleanupState(db, run.runId);
  if (!state || state.pending) {
    throw new SmokeCheckFailedError(`runtime-cleaned came for ${run.runId}, but its fence is still up`);
  }
  if (!state.releasedAt) {
    throw new SmokeCheckFailedError(
      `runtime-cleaned came for ${run.runId}, but generation ${run.generation} of its sandbox is not marked released`,
    );
  }
  if (!provisionerUrl) return;
  const response = await fetch(new URL('/api/sandboxes', provisionerUrl), {
    signal: AbortSignal.timeout(10_000),
  });
  const listing = (await response.json().catch(() => undefined)) as
    | { sandboxes?: Array<{ sandbox_id?: string }> }
    | undefined;
  if (!response.ok || !Array.isArray(listing?.sandboxes)) {
    throw new SmokeCheckFailedError(
      `cannot confirm the delete: GET ${provisionerUrl}/api/sandboxes answered ${response.status} without a listing`,
    );
  }
  if (listing.sandboxes.some((sandbox) => sandbox.sandbox_id === run.sandboxId)) {
    throw new SmokeCheckFailedError(
      `runtime-cleaned came for ${run.runId}, but the provisioner still lists sandbox ${run.sandboxId}`,
    );
  }
}
