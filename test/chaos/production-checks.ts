/**
 * The invariants that judge the production faults of issue 11 (production-faults.ts), as pure
 * functions over what was recorded, so a unit test can feed them known-bad histories.
 *
 * G  Every forged release was refused with its own reason: dead-lettered with the error code of
 *    its mismatch (or, for the checks that come after the fence's, skipped as stale once the fence
 *    was gone), never processed as a cleanup; and no decoy sandbox it named was deleted.
 * R  The provisioner's retryable and "gone" replies are honoured: a release is never dead-lettered
 *    as rejected (PROVISIONER_REJECTED) unless the provisioner really answered its sandbox with a
 *    non-retryable 4xx (not 404, 408, 409, 410 or 429); after a 429 with Retry-After, the next
 *    DELETE of that sandbox waits at least what that answer asked (as the provisioner recorded
 *    it), within the retry cap. A scope's runs share its sandbox id, so the ask is the answer's
 *    own, never one remembered for the sandbox: an earlier version judged a 1 s ask by a later
 *    run's 2 s one and reported a violation that was none.
 */
import type { Message } from '@aws-sdk/client-sqs';
import { type DeleteRequest, Invariant, type Violation } from './invariants.ts';
import type { ForgedExpectation } from './production-faults.ts';

/** A dead letter reduced to what the checks read. */
export interface DeadLetterFacts {
  sourceMessageId: string | undefined;
  errorCode: string | undefined;
  body: string;
}

export function deadLetterFacts(message: Message): DeadLetterFacts {
  const attributes = message.MessageAttributes ?? {};
  return {
    sourceMessageId: attributes.sourceMessageId?.StringValue,
    errorCode: attributes.errorCode?.StringValue,
    body: message.Body ?? '',
  };
}

export function checkForgedReleases(input: {
  forged: ReadonlyMap<string, ForgedExpectation>;
  /** Dead letters of the release queue. */
  releaseDeadLetters: readonly DeadLetterFacts[];
  acked: ReadonlySet<string>;
  decoys: ReadonlySet<string>;
  liveSandboxIds: ReadonlySet<string>;
  /**
   * The fence protocol's DELETEs (the reclaimer's left out). When given, a decoy counts as
   * deleted only if one of them deleted it: the reclaimer rightly collects a decoy, which no scope
   * owns, once its grace has passed, and that is invariant GC's to judge, not G's.
   */
  protocolDeletes?: readonly DeleteRequest[];
}): { violations: Violation[]; checked: number } {
  const violations: Violation[] = [];
  let checked = 0;
  const letters = new Map<string, DeadLetterFacts>();
  for (const letter of input.releaseDeadLetters) {
    if (letter.sourceMessageId) letters.set(letter.sourceMessageId, letter);
  }
  for (const [messageId, expected] of input.forged) {
    checked += 1;
    const letter = letters.get(messageId);
    if (letter && expected.codes.includes(letter.errorCode ?? '')) continue;
    if (!letter && expected.staleMayBeSkipped && input.acked.has(messageId)) continue;
    violations.push({
      invariant: Invariant.FORGED_RELEASES_REFUSED,
      key: `G:${messageId}`,
      message: letter
        ? `a forged release (${expected.variant}) was dead-lettered as ${letter.errorCode}, not ${expected.codes.join(' or ')}`
        : `a forged release (${expected.variant}) was ${input.acked.has(messageId) ? 'processed as a cleanup' : 'never dealt with'} instead of refused as ${expected.codes.join(' or ')}`,
      details: { messageId, ...expected, deadLetter: letter ?? null },
    });
  }
  for (const decoy of input.decoys) {
    checked += 1;
    if (input.liveSandboxIds.has(decoy)) continue;
    if (
      input.protocolDeletes &&
      !input.protocolDeletes.some(
        (request) => request.sandboxId === decoy && request.deletedGeneration !== undefined,
      )
    ) {
      continue;
    }
    violations.push({
      invariant: Invariant.FORGED_RELEASES_REFUSED,
      key: `G:decoy:${decoy}`,
      message: `sandbox ${decoy}, owned by no scope and named only by a forged release, was deleted`,
      details: { sandboxId: decoy },
    });
  }
  return { violations, checked };
}

/** 4xx answers that are not a rejection of the request: gone, a conflict, or "try again". */
const NOT_REJECTIONS = new Set([404, 408, 409, 410, 429]);

export function checkProvisionerReplies(input: {
  releaseDeadLetters: readonly DeadLetterFacts[];
  deletes: readonly DeleteRequest[];
  retryCapMs: number;
  /** Time a retry may come early by the two clocks and timers involved. */
  toleranceMs?: number;
}): { violations: Violation[]; checked: number } {
  const violations: Violation[] = [];
  let checked = 0;
  const tolerance = input.toleranceMs ?? 100;
  const bySandbox = new Map<string, DeleteRequest[]>();
  for (const request of input.deletes) {
    if (request.sandboxId === undefined) continue;
    bySandbox.set(request.sandboxId, [...(bySandbox.get(request.sandboxId) ?? []), request]);
  }
  for (const letter of input.releaseDeadLetters) {
    if (letter.errorCode !== 'PROVISIONER_REJECTED') continue;
    checked += 1;
    let sandboxId: string | undefined;
    try {
      sandboxId = (JSON.parse(letter.body) as { sandboxId?: unknown }).sandboxId as string | undefined;
    } catch {}
    const answers = (sandboxId === undefined ? [] : (bySandbox.get(sandboxId) ?? []))
      .map((request) => request.status)
      .filter((status): status is number => status !== undefined);
    if (answers.some((status) => status >= 400 && status < 500 && !NOT_REJECTIONS.has(status))) continue;
    violations.push({
      invariant: Invariant.PROVISIONER_REPLIES_HONOURED,
      key: `R:rejected:${letter.sourceMessageId}`,
      message: `the release of ${sandboxId} was dead-lettered as PROVISIONER_REJECTED, but the provisioner only answered it ${[...new Set(answers)].join(', ') || 'nothing'}: a retryable or "gone" reply taken for a rejection`,
      details: { sandboxId, answers, sourceMessageId: letter.sourceMessageId },
    });
  }
  for (const [sandboxId, requests] of bySandbox) {
    const inOrder = [...requests].sort((a, b) => a.startedAt - b.startedAt);
    for (const [index, request] of inOrder.entries()) {
      const askedMs = request.retryAfterAskedMs;
      if (request.status !== 429 || askedMs === undefined || request.endedAt === undefined) continue;
      const next = inOrder[index + 1];
      if (!next) continue;
      checked += 1;
      const owedMs = Math.min(askedMs, input.retryCapMs);
      const waitedMs = next.startedAt - request.endedAt;
      if (waitedMs >= owedMs - tolerance) continue;
      violations.push({
        invariant: Invariant.PROVISIONER_REPLIES_HONOURED,
        key: `R:retry-after:${request.seq}`,
        message: `DELETE ${sandboxId} was retried ${Math.round(waitedMs)} ms after a 429 that asked for ${Math.round(askedMs)} ms (cap ${input.retryCapMs} ms)`,
        details: {
          sandboxId,
          askedMs: Math.round(askedMs),
          waitedMs: Math.round(waitedMs),
          first: { seq: request.seq, generation: request.generation, fault: request.fault },
          next: { seq: next.seq, generation: next.generation, status: next.status, fault: next.fault },
        },
      });
    }
  }
  return { violations, checked };
}
