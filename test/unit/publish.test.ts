import { describe, expect, it } from 'vitest';
import {
  deliveryDeduplicationId,
  postgresTimestampMs,
  releaseGroupId,
} from '../../functions/adapters/publish.ts';

describe('release message group', () => {
  it('is the contract group <uid>:<runtime_scope_id> when SQS accepts it', () => {
    expect(releaseGroupId('user-1', 'scope-a')).toBe('user-1:scope-a');
  });

  it('is a stable hash when the pair is too long or holds characters SQS refuses', () => {
    const long = releaseGroupId('u'.repeat(100), 's'.repeat(100));
    const unicode = releaseGroupId('usér', 'scope with spaces');
    expect(long).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(unicode).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(releaseGroupId('usér', 'scope with spaces')).toBe(unicode);
    expect(releaseGroupId('usér', 'scope with space')).not.toBe(unicode);
  });
});

describe('FIFO deduplication id of a release', () => {
  const delivery = { messageId: 'm-1', sentTimestamp: '1700000000000', receiveCount: 1 };

  it('is the same for one delivery, so SDK retries of a send collapse', () => {
    expect(deliveryDeduplicationId(delivery)).toBe(deliveryDeduplicationId({ ...delivery }));
  });

  it('differs for every legitimate retry: a redelivery, another message, a redriven dead letter', () => {
    const ids = new Set([
      deliveryDeduplicationId(delivery),
      deliveryDeduplicationId({ ...delivery, receiveCount: 2 }),
      deliveryDeduplicationId({ ...delivery, messageId: 'm-2' }),
      deliveryDeduplicationId({ ...delivery, sentTimestamp: '1700000099999' }),
    ]);
    expect(ids.size).toBe(4);
    for (const id of ids) expect(id.length).toBeLessThanOrEqual(128);
  });
});

describe('PostgreSQL timestamptz text', () => {
  it('converts to epoch milliseconds, whatever the offset', () => {
    expect(postgresTimestampMs('2026-11-30 05:12:01.123456+00')).toBe(Date.parse('2026-11-30T05:12:01.123Z'));
    expect(postgresTimestampMs('2026-11-30 07:12:01.5+02')).toBe(Date.parse('2026-11-30T05:12:01.500Z'));
  });
});
