/**
 * One schema per queue body, used both to parse what arrives and to type what is sent. Bodies
 * are untrusted: every string is bounded and free of NUL (PostgreSQL text cannot hold it, and a
 * value the database would reject must be refused here, with a reason, not retried).
 */
import { en } from 'zod/locales';
import * as z from 'zod/mini';
import { InvalidMessageError } from '../cleanup/errors.ts';
import { ReleaseOutcome } from '../cleanup/types.ts';

/*
 * zod/mini rather than zod's classic API: the classic schemas carry every method and load every
 * locale, so esbuild could not shake any of it out, and it was 786 KB of every bundle (58 % of the
 * sweeper's). zod/mini loads no locale by itself: the English one keeps the issue texts that
 * dead-letter reasons quote (`runId: Too big: …`, docs/integration.md).
 */
z.config(en());

/**
 * How long each field of a cleanup message may be, in characters (UTF-16 code units, as
 * JavaScript and zod count them). The database columns are unbounded `text`; these limits are what
 * one SQS message can carry: with every field at its limit and every character written as a
 * six-byte JSON escape (a control character), a release or finalize body is
 * 6 × (4 × 4096 + 16384 + 64) + its keys ≈ 197 KB, under SQS's 256 KiB (262,144 bytes) with room
 * for the dead-letter attributes. A run whose values exceed them cannot be carried: the function
 * that reads it from the database refuses to send it (`assertSendable`) and dead-letters its own
 * message with a reason naming the field, instead of sending a body that the next consumer would
 * dead-letter over and over. docs/integration.md (section 2) lists them.
 */
export const MESSAGE_FIELD_LIMITS = {
  /** runId, uid, runtimeScopeId, sandboxId. */
  id: 4096,
  workdirPath: 16_384,
  fenceSetAt: 64,
} as const;

/** SQS's largest message body. */
export const SQS_MAX_BODY_BYTES = 256 * 1024;

const MAX_ID_LENGTH = MESSAGE_FIELD_LIMITS.id;

function boundedText(max: number) {
  // A lone surrogate (valid as a JSON `\ud800` escape) cannot be encoded either: PostgreSQL would
  // be asked about U+FFFD instead, and a URL cannot carry it at all (encodeURIComponent throws).
  return z.string().check(
    z.minLength(1),
    z.maxLength(max),
    z.refine((value) => !value.includes('\u0000'), { message: 'must not contain NUL characters' }),
    z.refine((value) => !LONE_SURROGATE.test(value), { message: 'must be well-formed Unicode' }),
  );
}

const LONE_SURROGATE = /\p{Cs}/u;

const id = boundedText(MAX_ID_LENGTH);
const generation = z.int().check(z.minimum(0), z.maximum(Number.MAX_SAFE_INTEGER));
const isoTimestamp = z.iso.datetime({ offset: true });
/** How often a chain was deferred or restarted (deferral.ts): small, never negative. */
const chainCount = z.int().check(z.minimum(0), z.maximum(10_000));

/**
 * `run-finished`: `{"runId": "<id>"}` from the platform or the sweeper; other fields are ignored.
 * `deferrals` counts how often a fence check was put off because the scope was still busy; it is
 * read from the cleanup's own re-sends only (chain-limits.ts, `trustedCount`): in a message from
 * outside it is ignored.
 */
export const RunFinishedMessage = z.object({
  runId: id,
  deferrals: z.catch(z.optional(chainCount), undefined),
  /** How often the chain restarted at phase 1 (chain-limits.ts, `trustedCount`); same trust rule. */
  restarts: z.catch(z.optional(chainCount), undefined),
});
export type RunFinishedMessage = z.infer<typeof RunFinishedMessage>;

export const CleanupIdentityBody = z.object({
  runId: id,
  uid: id,
  runtimeScopeId: id,
  workdirPath: boundedText(MESSAGE_FIELD_LIMITS.workdirPath),
  sandboxId: z.nullable(boundedText(MAX_ID_LENGTH)),
  generation: z.nullable(generation),
  fenceSetAt: z.nullable(boundedText(MESSAGE_FIELD_LIMITS.fenceSetAt)),
});

/** `runtime-release.fifo`: delete this generation of this scope's sandbox. */
export const ReleaseCommand = z.extend(CleanupIdentityBody, {
  sandboxId: boundedText(MAX_ID_LENGTH),
  generation,
  requestedAt: isoTimestamp,
  /** The chain's restarts so far (chain-limits.ts): an internal queue, the count travels as is. */
  restarts: z.optional(chainCount),
});
export type ReleaseCommand = z.infer<typeof ReleaseCommand>;

/** `runtime-finalize`: the captured generation is confirmed gone (or there was none); clear the fence. */
export const FinalizeCommand = z.extend(CleanupIdentityBody, {
  releaseOutcome: z.enum([...Object.values(ReleaseOutcome), 'nothing_to_delete']),
  releasedAt: isoTimestamp,
  deferrals: z.optional(chainCount),
  restarts: z.optional(chainCount),
});
export type FinalizeCommand = z.infer<typeof FinalizeCommand>;

/** `runtime-cleaned`: published at least once after the fence was cleared (or found clear). */
export const RuntimeCleanedEvent = z.object({
  runId: id,
  uid: id,
  runtimeScopeId: id,
  generation: z.nullable(generation),
  cleanedAt: isoTimestamp,
  /** Set when an operator cleared the fence without a confirmed delete. */
  forced: z.optional(z.boolean()),
});
export type RuntimeCleanedEvent = z.infer<typeof RuntimeCleanedEvent>;

const MAX_REASON_LENGTH = 300;

/** Parses a queue body or throws InvalidMessageError naming what is wrong (never echoing it whole). */
export function parseMessage<Schema extends z.ZodMiniType>(schema: Schema, body: string): z.infer<Schema> {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch (error) {
    // Only the position: the parser's own message quotes part of the body, which may be secret.
    const position = /position (\d+)/.exec((error as Error).message)?.[1];
    throw new InvalidMessageError(
      `body is not valid JSON${position ? ` (at position ${position})` : ''} (${body.length} characters)`,
      { reason: 'malformed_json' },
    );
  }
  const parsed = schema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues
      .slice(0, 3)
      .map((issue) => `${issue.path.join('.') || '(body)'}: ${issue.message}`)
      .join('; ');
    throw new InvalidMessageError(`body does not match the schema: ${issues}`.slice(0, MAX_REASON_LENGTH), {
      reason: 'wrong_shape',
    });
  }
  return parsed.data;
}

/**
 * Checks a body this process is about to send against the schema its consumer parses with, so a
 * value the consumer would refuse (a field longer than MESSAGE_FIELD_LIMITS, read from the
 * unbounded database columns) is refused HERE, once, with the field named: an InvalidMessageError
 * (not retryable), which dead-letters the message being processed with that reason. Sent, the
 * body would be dead-lettered by its consumer, and the fence would be announced again and again.
 */
export function assertSendable<Schema extends z.ZodMiniType>(
  schema: Schema,
  body: unknown,
  queue: string,
): void {
  const parsed = schema.safeParse(body);
  if (parsed.success) {
    const bytes = Buffer.byteLength(JSON.stringify(body), 'utf8');
    if (bytes <= SQS_MAX_BODY_BYTES) return;
    throw new InvalidMessageError(
      `cannot send to ${queue}: the body is ${bytes} bytes, more than SQS's ${SQS_MAX_BODY_BYTES}`,
      { reason: 'body_too_large', queue, bytes },
    );
  }
  const issue = parsed.error.issues[0]!;
  const field = issue.path.join('.') || '(body)';
  const value = issue.path.reduce<unknown>(
    (current, key) => (current as Record<PropertyKey, unknown> | undefined)?.[key as PropertyKey],
    body,
  );
  const length = typeof value === 'string' ? value.length : undefined;
  const tooLong = issue.code === 'too_big' && length !== undefined;
  const what = tooLong
    ? `${field} is ${length} characters, more than the ${(issue as { maximum?: unknown }).maximum} a cleanup message carries`
    : `${field}: ${issue.message}`;
  throw new InvalidMessageError(`cannot send to ${queue}: ${what}`.slice(0, MAX_REASON_LENGTH), {
    reason: tooLong ? 'field_too_long' : 'unsendable',
    queue,
    field,
    ...(length !== undefined ? { length } : {}),
  });
}
