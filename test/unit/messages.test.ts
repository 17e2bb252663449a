/**
 * Queue bodies are untrusted. Whatever arrives either parses into the schema's type or fails
 * with a non-retryable InvalidMessageError whose reason says what is wrong in a bounded, short
 * text that never repeats the body (it ends up in dead-letter attributes and logs).
 */
import { describe, expect, it } from 'vitest';
import {
  assertSendable,
  FinalizeCommand,
  MESSAGE_FIELD_LIMITS,
  parseMessage,
  ReleaseCommand,
  RunFinishedMessage,
  RuntimeCleanedEvent,
  SQS_MAX_BODY_BYTES,
} from '../../functions/adapters/messages.ts';
import { ErrorCode, InvalidMessageError } from '../../functions/cleanup/errors.ts';

function invalid(schema: Parameters<typeof parseMessage>[0], body: string): InvalidMessageError {
  try {
    parseMessage(schema, body);
  } catch (error) {
    expect(error).toBeInstanceOf(InvalidMessageError);
    expect(error).toMatchObject({ code: ErrorCode.MESSAGE_INVALID, retryable: false });
    return error as InvalidMessageError;
  }
  throw new Error(`expected ${body.slice(0, 80)} to be refused`);
}

const identity = {
  runId: 'run-1',
  uid: 'user-1',
  runtimeScopeId: 'scope-1',
  workdirPath: 'projects/5d0f',
  sandboxId: 'sbx-1',
  generation: 3,
  fenceSetAt: '2025-01-02 03:04:05.678901+00',
};

describe('run-finished', () => {
  it('reads {"runId"} and ignores every other field', () => {
    const parsed = parseMessage(
      RunFinishedMessage,
      JSON.stringify({ runId: 'run-1', status: 'completed', extra: { nested: [1, 2] }, uid: 5 }),
    );
    expect(parsed).toEqual({ runId: 'run-1' });
  });

  it('keeps a valid deferral count and drops an invalid one instead of refusing the message', () => {
    expect(parseMessage(RunFinishedMessage, '{"runId":"r","deferrals":2}').deferrals).toBe(2);
    expect(parseMessage(RunFinishedMessage, '{"runId":"r","deferrals":"lots"}').deferrals).toBeUndefined();
    expect(parseMessage(RunFinishedMessage, '{"runId":"r","deferrals":-1}').deferrals).toBeUndefined();
  });

  it.each(['', 'not json', '{"runId":', '{runId: "r"}', "{'runId':'r'}"])(
    'refuses malformed JSON %j',
    (body) => {
      expect(invalid(RunFinishedMessage, body).details.reason).toBe('malformed_json');
    },
  );

  it.each([
    ['an empty object', '{}'],
    ['null', 'null'],
    ['an array', '[{"runId":"r"}]'],
    ['a string', '"run-1"'],
    ['a numeric runId', '{"runId":42}'],
    ['an empty runId', '{"runId":""}'],
    ['a runId hidden in __proto__', '{"__proto__":{"runId":"r"}}'],
  ])('refuses %s as the wrong shape, naming the field', (_name, body) => {
    const error = invalid(RunFinishedMessage, body);
    expect(error.details.reason).toBe('wrong_shape');
    expect(error.message).toMatch(/runId|\(body\)/);
  });

  it('refuses NUL characters, which PostgreSQL text cannot hold', () => {
    const error = invalid(RunFinishedMessage, JSON.stringify({ runId: 'run\u0000-1' }));
    expect(error.message).toContain('NUL');
  });

  it('refuses a huge runId with a short reason that does not repeat it', () => {
    const secret = `s3cret-${'x'.repeat(1_000_000)}`;
    const error = invalid(RunFinishedMessage, JSON.stringify({ runId: secret }));
    expect(error.message.length).toBeLessThanOrEqual(300);
    expect(error.message).not.toContain('s3cret');
  });

  it('keeps the reason short for a huge malformed body', () => {
    const error = invalid(RunFinishedMessage, `{"runId": "${'y'.repeat(500_000)}`);
    expect(error.message.length).toBeLessThanOrEqual(300);
  });

  it('does not echo other fields of a wrongly shaped body', () => {
    const error = invalid(RunFinishedMessage, JSON.stringify({ runId: 7, token: 'tok-abcdef-123456' }));
    expect(error.message).not.toContain('tok-abcdef');
  });
});

describe('release, finalize and cleaned bodies', () => {
  it('round-trips a release command', () => {
    const command = { ...identity, requestedAt: '2025-01-02T03:04:05.678Z' };
    expect(parseMessage(ReleaseCommand, JSON.stringify(command))).toEqual(command);
  });

  it.each([
    ['a null sandbox id', { sandboxId: null }],
    ['a negative generation', { generation: -1 }],
    ['a fractional generation', { generation: 1.5 }],
    ['a generation beyond 2^53', { generation: 2 ** 53 }],
    ['a generation as a string', { generation: '3' }],
    ['a requestedAt that is not a timestamp', { requestedAt: 'yesterday' }],
    ['a missing uid', { uid: undefined }],
    ['a Workdir over 16384 characters', { workdirPath: 'p'.repeat(16_385) }],
    ['a scope id over 4096 characters', { runtimeScopeId: 's'.repeat(4_097) }],
    ['a sandbox id over 4096 characters', { sandboxId: 'x'.repeat(4_097) }],
  ])('refuses a release command with %s', (_name, change) => {
    const body = JSON.stringify({ ...identity, requestedAt: '2025-01-02T03:04:05.678Z', ...change });
    expect(invalid(ReleaseCommand, body).details.reason).toBe('wrong_shape');
  });

  it('accepts a finalize command for a scope that had nothing to delete, and refuses an unknown outcome', () => {
    const nothing = {
      ...identity,
      sandboxId: null,
      generation: null,
      releaseOutcome: 'nothing_to_delete',
      releasedAt: '2025-01-02T03:04:05Z',
    };
    expect(parseMessage(FinalizeCommand, JSON.stringify(nothing))).toMatchObject({
      releaseOutcome: 'nothing_to_delete',
    });
    invalid(FinalizeCommand, JSON.stringify({ ...nothing, releaseOutcome: 'probably_deleted' }));
  });

  it('types runtime-cleaned as the contract lists it', () => {
    const event = {
      runId: 'r',
      uid: 'u',
      runtimeScopeId: 's',
      generation: 2,
      cleanedAt: '2025-01-02T03:04:05.000Z',
    };
    expect(parseMessage(RuntimeCleanedEvent, JSON.stringify(event))).toEqual(event);
    invalid(RuntimeCleanedEvent, JSON.stringify({ ...event, cleanedAt: 1735787045 }));
  });
});

describe('field limits agree with what one SQS message can carry', () => {
  const atLimit = (unit: string, limit: number) => unit.repeat(limit);

  it.each([
    ['a control character (a six-byte JSON escape)', '\u0001'],
    ['a three-byte UTF-8 character', '€'],
    ['a quote (a two-byte escape)', '"'],
  ])(
    'keeps a release and a finalize body with every field at its limit, made of %s, under 256 KiB',
    (_name, unit) => {
      const widest = {
        runId: atLimit(unit, MESSAGE_FIELD_LIMITS.id),
        uid: atLimit(unit, MESSAGE_FIELD_LIMITS.id),
        runtimeScopeId: atLimit(unit, MESSAGE_FIELD_LIMITS.id),
        workdirPath: atLimit(unit, MESSAGE_FIELD_LIMITS.workdirPath),
        sandboxId: atLimit(unit, MESSAGE_FIELD_LIMITS.id),
        generation: Number.MAX_SAFE_INTEGER,
        fenceSetAt: atLimit(unit, MESSAGE_FIELD_LIMITS.fenceSetAt),
      };
      const release = { ...widest, requestedAt: '2025-01-02T03:04:05.678Z' };
      const finalize = {
        ...widest,
        releaseOutcome: 'superseded',
        releasedAt: '2025-01-02T03:04:05.678Z',
        deferrals: 10_000,
      };
      for (const [schema, body] of [
        [ReleaseCommand, release],
        [FinalizeCommand, finalize],
      ] as const) {
        const text = JSON.stringify(body);
        // Room left for the dead-letter attributes (reason ≤ 300 characters and a few short ones).
        expect(Buffer.byteLength(text, 'utf8')).toBeLessThan(SQS_MAX_BODY_BYTES - 4_096);
        expect(parseMessage(schema, text)).toEqual(body);
        expect(() => assertSendable(schema, body, 'q')).not.toThrow();
      }
    },
  );

  it('accepts a 600-character scope id and sandbox id (the old 256/512 limits refused them)', () => {
    const command = {
      ...identity,
      runtimeScopeId: 's'.repeat(600),
      sandboxId: `sbx-${'s'.repeat(600)}`,
      requestedAt: '2025-01-02T03:04:05.678Z',
    };
    expect(parseMessage(ReleaseCommand, JSON.stringify(command))).toEqual(command);
  });

  it('refuses to send a body its consumer would refuse, naming the field and its length (non-retryable)', () => {
    const body = { ...identity, runtimeScopeId: 's'.repeat(5_000), requestedAt: '2025-01-02T03:04:05.678Z' };
    let error: InvalidMessageError | undefined;
    try {
      assertSendable(ReleaseCommand, body, 'runtime-release.fifo');
    } catch (failure) {
      error = failure as InvalidMessageError;
    }
    expect(error).toBeInstanceOf(InvalidMessageError);
    expect(error).toMatchObject({
      retryable: false,
      details: {
        reason: 'field_too_long',
        field: 'runtimeScopeId',
        length: 5_000,
        queue: 'runtime-release.fifo',
      },
    });
    expect(error!.message).toBe(
      'cannot send to runtime-release.fifo: runtimeScopeId is 5000 characters, more than the 4096 a cleanup message carries',
    );
  });
});
