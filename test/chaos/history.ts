/**
 * The history the invariants are judged on (invariants.ts `History`), built from what the engine
 * recorded: the ledger's run and sandbox transitions moved onto this process's clock, the
 * provisioner's audit of every DELETE, and the release commands the fence check published.
 */
import type { ReleaseCommand } from '../../functions/adapters/messages.ts';
import { postgresTimestampMs } from '../../functions/adapters/publish.ts';
import type { AuditEntry } from '../../infra/local/provisioner/server.ts';
import type { ClockSync } from './clock.ts';
import type { CapturedRelease, DeleteRequest, History } from './invariants.ts';
import type { LedgerReader } from './ledger.ts';
import type { MessageLog } from './message-log.ts';
import type { ScopePool } from './platform-ops.ts';

/**
 * A DELETE of the provisioner's audit as the invariants read it. Every field is copied by name: a
 * field dropped here (as `retryAfterAskedMs` could be) would leave its invariant judging nothing.
 */
export function deleteRequestOf(entry: AuditEntry): DeleteRequest {
  return {
    seq: entry.seq,
    path: entry.path,
    sandboxId: entry.sandboxId,
    generation: entry.generation,
    status: entry.status,
    outcome: entry.outcome,
    fault: entry.fault,
    retryAfterAskedMs: entry.retryAfterAskedMs,
    startedAt: entry.startedAt,
    endedAt: entry.endedAt,
    deletedGeneration: entry.deletedGeneration,
    deletedAt: entry.deletedAt,
  };
}

export function buildHistory(input: {
  ledger: LedgerReader;
  clock: ClockSync;
  audit: ReadonlyMap<number, AuditEntry>;
  messages: MessageLog;
  scopes: ScopePool;
  settledBeforeMs: number;
}): History {
  const { ledger, clock, audit, messages, scopes, settledBeforeMs } = input;
  const runLog = [...ledger.runs.values()].map((entry) => ({
    ...entry,
    atMs: clock.toLocal(entry.atMs),
    pendingSinceMs: entry.pendingSinceMs === null ? null : clock.toLocal(entry.pendingSinceMs),
  }));
  const sandboxLog = [...ledger.sandboxes.values()].map((entry) => ({
    ...entry,
    atMs: clock.toLocal(entry.atMs),
  }));
  const deletes = [...audit.values()].filter((entry) => entry.method === 'DELETE').map(deleteRequestOf);
  const releases: CapturedRelease[] = [];
  for (const message of messages.sent.values()) {
    // Hostile and forged commands are nobody's capture: a DELETE they caused names no captured pair.
    if (
      message.queue !== 'runtime-release.fifo' ||
      message.origin === 'hostile' ||
      message.origin === 'forged'
    )
      continue;
    const body = JSON.parse(message.body) as ReleaseCommand;
    releases.push({
      origin: message.origin,
      sentAtMs: message.sentAtMs,
      runId: body.runId,
      uid: body.uid,
      runtimeScopeId: body.runtimeScopeId,
      sandboxId: body.sandboxId,
      generation: body.generation,
      fenceSetAt: body.fenceSetAt,
    });
  }
  return {
    runLog,
    sandboxLog,
    deletes,
    sandboxScope: scopes.sandboxScopes(),
    releases,
    fenceTextToLocalMs: (text: string) => clock.toLocal(postgresTimestampMs(text)),
    settledBeforeMs,
  };
}
