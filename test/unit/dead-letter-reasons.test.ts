import { describe, expect, it } from 'vitest';
import {
  type DeadLetter,
  groupReasons,
  SQS_REDRIVE,
  SQS_REDRIVE_DUPLICATE,
} from '../../infra/ops/dead-letters.ts';

function letter(overrides: Partial<DeadLetter>): DeadLetter {
  return {
    deadLetterQueue: 'runtime-finalize-dlq',
    sourceQueue: 'runtime-finalize',
    messageId: 'dlq-message',
    runId: 'run-1',
    errorCode: null,
    reason: null,
    receiveCount: null,
    deadLetteredAt: null,
    sourceMessageId: null,
    body: '{}',
    ...overrides,
  };
}

describe('dead-letter reasons', () => {
  it('groups letters by error code and reason, most frequent first', () => {
    const grouped = groupReasons([
      letter({ messageId: 'a', errorCode: 'RUN_NOT_FOUND', reason: 'gone' }),
      letter({ messageId: 'b', errorCode: 'MESSAGE_INVALID', reason: 'bad' }),
      letter({ messageId: 'c', errorCode: 'MESSAGE_INVALID', reason: 'bad' }),
    ]);
    expect(grouped).toEqual([
      { errorCode: 'MESSAGE_INVALID', reason: 'bad', count: 2 },
      { errorCode: 'RUN_NOT_FOUND', reason: 'gone', count: 1 },
    ]);
  });

  it("names SQS's second copy of a letter the function already dead-lettered with its reason", () => {
    const grouped = groupReasons([
      letter({
        messageId: 'ours',
        errorCode: 'PROVISIONER_UNAVAILABLE',
        reason: 'retries exhausted',
        sourceMessageId: 'original',
      }),
      letter({ messageId: 'original' }),
      letter({ messageId: 'unrelated' }),
    ]);
    expect(grouped.map((group) => group.errorCode).sort()).toEqual(
      ['PROVISIONER_UNAVAILABLE', SQS_REDRIVE, SQS_REDRIVE_DUPLICATE].sort(),
    );
  });
});
