/**
 * Every message the functions send, typed by the schema its consumer parses with.
 */
import { createHash } from 'node:crypto';
import { MAX_SQS_DELAY_SECONDS } from '../cleanup/backoff.ts';
import { DEFERRALS_ATTRIBUTE, RESTARTS_ATTRIBUTE } from '../cleanup/chain-limits.ts';
import type { CleanupIdentity, ReleaseOutcome } from '../cleanup/types.ts';
import {
  assertSendable,
  FinalizeCommand,
  ReleaseCommand,
  type RunFinishedMessage,
  type RuntimeCleanedEvent,
} from './messages.ts';
import { QueueName, type Queues } from './queues.ts';

/** FIFO group ids allow at most 128 characters from a restricted set (SQS API reference). */
const GROUP_ID_ALLOWED = /^[\x21-\x7e]{1,128}$/;

/**
 * The release queue's message group: `<uid>:<runtime_scope_id>` (contract), so one scope's
 * releases never run concurrently anywhere. A pair SQS would refuse as a group id is hashed.
 */
export function releaseGroupId(uid: string, runtimeScopeId: string): string {
  const plain = `${uid}:${runtimeScopeId}`;
  return GROUP_ID_ALLOWED.test(plain) ? plain : `sha256:${createHash('sha256').update(plain).digest('hex')}`;
}

/**
 * FIFO deduplication ids are remembered for 5 minutes, even after the message was deleted, and a
 * send with a remembered id is dropped silently. So the id names one *delivery* of the source
 * message (its id, when it was sent, and its receive count): the SDK's own retries of one send
 * collapse, while a legitimate retry (a redelivery, a new announcement, a redriven dead letter
 * whose receive count starts again) always gets a new id and is never dropped.
 */
export function deliveryDeduplicationId(source: {
  messageId: string;
  sentTimestamp?: string;
  receiveCount: number;
}): string {
  return createHash('sha256')
    .update(`${source.messageId}#${source.sentTimestamp ?? ''}#${source.receiveCount}`)
    .digest('hex');
}

export async function publishRelease(
  queues: Queues,
  identity: CleanupIdentity & { sandboxId: string; generation: number },
  source: { messageId: string; sentTimestamp?: string; receiveCount: number },
  options: { restarts?: number } = {},
): Promise<string> {
  const body: ReleaseCommand = {
    ...identity,
    requestedAt: new Date().toISOString(),
    ...(options.restarts ? { restarts: options.restarts } : {}),
  };
  assertSendable(ReleaseCommand, body, QueueName.RUNTIME_RELEASE);
  return queues.send(QueueName.RUNTIME_RELEASE, body, {
    groupId: releaseGroupId(identity.uid, identity.runtimeScopeId),
    deduplicationId: deliveryDeduplicationId(source),
  });
}

export async function publishFinalize(
  queues: Queues,
  identity: CleanupIdentity,
  releaseOutcome: ReleaseOutcome | 'nothing_to_delete',
  options: { deferrals?: number; delaySeconds?: number; releasedAt?: string; restarts?: number } = {},
): Promise<string> {
  const body: FinalizeCommand = {
    ...cleanupIdentity(identity),
    releaseOutcome,
    releasedAt: options.releasedAt ?? new Date().toISOString(),
    ...(options.deferrals ? { deferrals: options.deferrals } : {}),
    ...(options.restarts ? { restarts: options.restarts } : {}),
  };
  assertSendable(FinalizeCommand, body, QueueName.RUNTIME_FINALIZE);
  return queues.send(QueueName.RUNTIME_FINALIZE, body, delay(options.delaySeconds));
}

export async function announceRunFinished(
  queues: Queues,
  runId: string,
  options: { deferrals?: number; delaySeconds?: number; reason?: string; restarts?: number } = {},
): Promise<string> {
  const body: RunFinishedMessage & { reason?: string } = {
    runId,
    ...(options.deferrals ? { deferrals: options.deferrals } : {}),
    ...(options.restarts ? { restarts: options.restarts } : {}),
    ...(options.reason ? { reason: options.reason } : {}),
  };
  // The counts are trusted only with these attributes beside them (chain-limits.ts).
  const attributes: Record<string, string> = {
    ...(options.deferrals ? { [DEFERRALS_ATTRIBUTE]: String(options.deferrals) } : {}),
    ...(options.restarts ? { [RESTARTS_ATTRIBUTE]: String(options.restarts) } : {}),
  };
  return queues.send(QueueName.RUN_FINISHED, body, {
    ...delay(options.delaySeconds),
    ...(Object.keys(attributes).length ? { attributes } : {}),
  });
}

/**
 * Only the identity's own fields: a command passed in as the identity (finalize re-sending
 * itself, release forwarding its command) must not carry its other fields (an old count, the
 * release's requestedAt) into the new body.
 */
function cleanupIdentity(identity: CleanupIdentity): CleanupIdentity {
  const { runId, uid, runtimeScopeId, workdirPath, sandboxId, generation, fenceSetAt } = identity;
  return { runId, uid, runtimeScopeId, workdirPath, sandboxId, generation, fenceSetAt };
}

export async function publishCleaned(queues: Queues, event: RuntimeCleanedEvent): Promise<string> {
  return queues.send(QueueName.RUNTIME_CLEANED, event);
}

function delay(seconds: number | undefined) {
  return seconds && seconds > 0 ? { delaySeconds: Math.min(MAX_SQS_DELAY_SECONDS, Math.round(seconds)) } : {};
}

/**
 * A fence time as phase 1 emits it (ISO 8601, `2026-11-30T05:12:01.123456+00:00`) or as older
 * versions did (PostgreSQL's text form, `2026-11-30 05:12:01.123456+00`), as epoch ms.
 */
export function postgresTimestampMs(text: string): number {
  const iso = text.replace(' ', 'T').replace(/([+-]\d\d)$/, '$1:00');
  return Date.parse(iso);
}
