/**
 * One schema per queue body, used both to parse what arrives and to type what is sent. Bodies
 * are untrusted: every string is bounded and free of NUL (PostgreSQL text cannot hold it, and a
 * value the database would reject must be refused here, with a reason, not retried).
 */
import { z } from 'zod';
import { InvalidMessageError } from '../cleanup/errors.ts';
import { ReleaseOutcome } from '../cleanup/types.ts';

const MAX_ID_LENGTH = 256;

function boundedText(max: number) {
  // A lone surrogate (valid as a JSON `\ud800` escape) cannot be encoded either: PostgreSQL would
  // be asked about U+FFFD instead, and a URL cannot carry it at all (encodeURIComponent throws).
  return z
    .string()
    .min(1)
    .max(max)
    .refine((value) => !value.includes('\u0000'), { message: 'must not contain NUL characters' })
    .refine((value) => !LONE_SURROGATE.test(value), { message: 'must be well-formed Unicode' });
}

const LONE_SURROGATE = /\p{Cs}/u;

const id = boundedText(MAX_ID_LENGTH);
const generation = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const isoTimestamp = z.iso.datetime({ offset: true });

/**
 * `run-finished`: `{"runId": "<id>"}` from the platform or the sweeper; other fields are ignored.
 * `deferrals` counts how often a fence check was put off because the scope was still busy; it is
 * read from the cleanup's own re-sends only (deferral.ts, `trustedDeferrals`): in a message from
 * outside it is ignored.
 */
export const RunFinishedMessage = z.object({
  runId: id,
  deferrals: z.number().int().min(0).max(10_000).optional().catch(undefined),
});
export type RunFinishedMessage = z.infer<typeof RunFinishedMessage>;

export const CleanupIdentityBody = z.object({
  runId: id,
  uid: id,
  runtimeScopeId: id,
  workdirPath: boundedText(4096),
  sandboxId: boundedText(512).nullable(),
  generation: generation.nullable(),
  fenceSetAt: boundedText(64).nullable(),
});

/** `runtime-release.fifo`: delete this generation of this scope's sandbox. */
export const ReleaseCommand = CleanupIdentityBody.extend({
  sandboxId: boundedText(512),
  generation,
  requestedAt: isoTimestamp,
});
export type ReleaseCommand = z.infer<typeof ReleaseCommand>;

/** `runtime-finalize`: the captured generation is confirmed gone (or there was none); clear the fence. */
export const FinalizeCommand = CleanupIdentityBody.extend({
  releaseOutcome: z.enum([...Object.values(ReleaseOutcome), 'nothing_to_delete']),
  releasedAt: isoTimestamp,
  deferrals: z.number().int().min(0).max(10_000).optional(),
});
export type FinalizeCommand = z.infer<typeof FinalizeCommand>;

/** `runtime-cleaned`: published at least once after the fence was cleared (or found clear). */
export const RuntimeCleanedEvent = z.object({
  runId: id,
  uid: id,
  runtimeScopeId: id,
  generation: generation.nullable(),
  cleanedAt: isoTimestamp,
  /** Set when an operator cleared the fence without a confirmed delete. */
  forced: z.boolean().optional(),
});
export type RuntimeCleanedEvent = z.infer<typeof RuntimeCleanedEvent>;

const MAX_REASON_LENGTH = 300;

/** Parses a queue body or throws InvalidMessageError naming what is wrong (never echoing it whole). */
export function parseMessage<Schema extends z.ZodType>(schema: Schema, body: string): z.infer<Schema> {
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
