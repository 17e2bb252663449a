/**
 * Queue bodies are untrusted. Whatever arrives either parses into the schema's type or fails
 * with a non-retryable InvalidMessageError whose reason says what is wrong in a bounded, short
 * text that never repeats the body (it ends up in dead-letter attributes and logs).
 */
import { describe, expect, it } from 'vitest';
import {
  FinalizeCommand,
  parseMessage,
  ReleaseCommand,
  RunFinishedMessage,
  RuntimeCleanedEvent,
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
    ['a Workdir over 4096 characters', { workdirPath: 'p'.repeat(4_097) }],
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
