/**
 * Hostile queue bodies (fast-check arbitraries), shared by the property test
 * (test/e2e/hostile-input.test.ts) and the chaos runs: malformed JSON, wrong types, quotes and
 * SQL, NUL and lone surrogates, huge strings, path-traversal and URL-breaking sandbox ids — alone
 * or planted in an otherwise valid command, so that the hostile value reaches as far as the code
 * lets it (a valid-looking release with a traversal id goes all the way to the provisioner).
 */
import fc from 'fast-check';
import {
  FinalizeCommand,
  parseMessage,
  ReleaseCommand,
  RunFinishedMessage,
} from '../../functions/adapters/messages.ts';
import { assertSafeSandboxId } from '../../functions/adapters/provisioner-client.ts';
import type { ConsumedQueue } from './plan.ts';

export const HOSTILE_STRINGS = [
  '../../x',
  '..',
  '.',
  '%2e%2e',
  '%2e%2e%2f%2e%2e%2fetc',
  '..%2F..%2F_control%2Ffaults',
  'sbx/../../_control/faults',
  'a/b',
  '/absolute',
  '..\\..\\windows',
  'a?generation=1',
  'a#fragment',
  "'; DROP TABLE agent_runs; --",
  '" OR 1=1 --',
  "x'); DELETE FROM sandbox_runtimes; --",
  '$1',
  '\\',
  '\u0000',
  'nul\u0000inside',
  '\ud800',
  'lone\udc00surrogate',
  '\u202eevil',
  '\ufeffbom',
  'emoji😀',
  ' ',
  '\t\n',
  'null',
  '{"runId":"nested"}',
] as const;

/** The queue-body characters real SQS accepts (the XML 1.0 set); everything else is refused. */
export const SQS_TEXT = /^[\t\n\r\u0020-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]*$/u;

/**
 * fauxqs 2.4.1 checks bodies code unit by code unit (no `u` flag), so it refuses astral characters
 * (emoji) that SQS accepts, and refuses the lone surrogates and control characters SQS refuses.
 * Bodies sent through it have those code units written as JSON `\u` escapes: for a JSON body that
 * is the same value; a malformed body stays malformed.
 */
export function forEmulator(body: string): string {
  const escaped = body.replace(/[^\t\n\r\u0020-\uD7FF\uE000-\uFFFD]/g, (unit) => {
    return `\\u${unit.charCodeAt(0).toString(16).padStart(4, '0')}`;
  });
  return escaped.length > 0 ? escaped : ' ';
}

/**
 * Long strings, made by repetition (cheap): up to ~200 KB once JSON-encoded. Characters that JSON
 * or the emulator write as six-character escapes (NUL, emoji) repeat fewer times, so that a body
 * carrying one twice still fits SQS's 1 MiB message (a bigger one could never be delivered).
 */
const HUGE_UNITS: Record<string, number> = {
  a: 100_000,
  é: 100_000,
  '/': 100_000,
  '"': 100_000,
  '\\': 100_000,
  '😀': 30_000,
  '\u0000': 30_000,
};
const hugeString = fc
  .constantFrom(...Object.keys(HUGE_UNITS))
  .chain((unit) =>
    fc.integer({ min: 2_000, max: HUGE_UNITS[unit]! / unit.length }).map((count) => unit.repeat(count)),
  );

export const hostileText: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(...HOSTILE_STRINGS) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 40 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', maxLength: 40 }) },
  { weight: 1, arbitrary: hugeString },
);

const wrongType: fc.Arbitrary<unknown> = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.jsonValue({ maxDepth: 1 }), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 5 }), fc.jsonValue({ maxDepth: 1 }), { maxKeys: 3 }),
);

const hostileValue = fc.oneof(hostileText, wrongType);

const malformedJson: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom('{', '{"runId":', '{"runId": "x",}', "{'runId': 'x'}", '[', 'undefined', 'NaN', '\ufeff{}'),
  hostileText,
  fc.jsonValue({ maxDepth: 2 }).map((value) => JSON.stringify(value)),
);

/** A release command for a sandbox nobody owns: valid on its own, a carrier for one hostile field. */
export function releaseTemplate(): Record<string, unknown> {
  return {
    runId: 'run-hostile-nonexistent',
    uid: 'user-hostile',
    runtimeScopeId: 'scope-hostile',
    workdirPath: 'projects/hostile',
    sandboxId: 'sbx-hostile-nonexistent',
    generation: 1,
    fenceSetAt: '2026-01-01 00:00:00.000001+00',
    requestedAt: '2026-01-01T00:00:00.000Z',
  };
}

export function finalizeTemplate(): Record<string, unknown> {
  const { requestedAt: _requestedAt, ...identity } = releaseTemplate();
  return { ...identity, releaseOutcome: 'deleted', releasedAt: '2026-01-01T00:00:01.000Z' };
}

function planted(template: () => Record<string, unknown>): fc.Arbitrary<string> {
  const fields = Object.keys(template());
  return fc.tuple(fc.constantFrom(...fields), hostileValue, fc.boolean()).map(([field, value, dropField]) => {
    const body = template();
    if (dropField) delete body[field];
    else body[field] = value;
    return JSON.stringify(body);
  });
}

/** A valid-shaped release whose sandbox id is hostile: it reaches the provisioner, encoded. */
const releaseWithHostileSandboxId = hostileText.map((sandboxId) =>
  JSON.stringify({ ...releaseTemplate(), sandboxId }),
);

export const hostileBodies: Record<ConsumedQueue, fc.Arbitrary<string>> = {
  'run-finished': fc.oneof(
    malformedJson,
    hostileValue.map((runId) => JSON.stringify({ runId })),
    hostileText.map((runId) => JSON.stringify({ runId, deferrals: 'many', extra: runId })),
  ),
  'runtime-release.fifo': fc.oneof(malformedJson, planted(releaseTemplate), releaseWithHostileSandboxId),
  'runtime-finalize': fc.oneof(malformedJson, planted(finalizeTemplate)),
};

/** One hostile message: a queue and a body as the emulator will carry it. */
export const hostileMessage: fc.Arbitrary<{ queue: ConsumedQueue; body: string }> = fc
  .constantFrom<ConsumedQueue>('run-finished', 'runtime-release.fifo', 'runtime-finalize')
  .chain((queue) => hostileBodies[queue].map((body) => ({ queue, body: forEmulator(body) })));

export const ExpectedFate = {
  /** Refused on sight: MESSAGE_INVALID into the queue's own DLQ. */
  INVALID: 'invalid',
  /** Well-formed, but it names a run that does not exist: RUN_NOT_FOUND into the queue's DLQ. */
  UNKNOWN_RUN: 'unknown_run',
  /**
   * A well-formed release naming an unknown run *and* an unusable sandbox id: either refusal is
   * right (which check comes first is the handler's business), but it must be one of them.
   */
  INVALID_OR_UNKNOWN_RUN: 'invalid_or_unknown_run',
} as const;
export type ExpectedFate = (typeof ExpectedFate)[keyof typeof ExpectedFate];

/** The error codes a dead letter of each fate may carry. */
export const FATE_CODES: Record<ExpectedFate, readonly string[]> = {
  [ExpectedFate.INVALID]: ['MESSAGE_INVALID'],
  [ExpectedFate.UNKNOWN_RUN]: ['RUN_NOT_FOUND'],
  [ExpectedFate.INVALID_OR_UNKNOWN_RUN]: ['MESSAGE_INVALID', 'RUN_NOT_FOUND'],
};

/** What must become of a hostile body, decided with the production schemas themselves. */
export function expectedFate(queue: ConsumedQueue, body: string): ExpectedFate {
  const schema =
    queue === 'run-finished'
      ? RunFinishedMessage
      : queue === 'runtime-release.fifo'
        ? ReleaseCommand
        : FinalizeCommand;
  let parsed: { sandboxId?: string | null };
  try {
    parsed = parseMessage(schema, body) as { sandboxId?: string | null };
  } catch {
    return ExpectedFate.INVALID;
  }
  if (queue !== 'runtime-release.fifo') return ExpectedFate.UNKNOWN_RUN;
  try {
    assertSafeSandboxId(parsed.sandboxId ?? '');
  } catch {
    return ExpectedFate.INVALID_OR_UNKNOWN_RUN;
  }
  return ExpectedFate.UNKNOWN_RUN;
}
