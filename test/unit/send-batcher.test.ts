import { describe, expect, it } from 'vitest';
import {
  type BatchEntry,
  type BatchOutcome,
  createSendBatcher,
  MAX_BATCH_BYTES,
} from '../../functions/adapters/send-batcher.ts';

/** A recording stand-in for SendMessageBatch: the batcher's own logic is what is under test. */
function recorder(fail: (entry: BatchEntry) => boolean = () => false) {
  const calls: Array<{ queue: string; bodies: string[] }> = [];
  let sequence = 0;
  const sendBatch = async (queue: string, entries: BatchEntry[]): Promise<BatchOutcome> => {
    calls.push({ queue, bodies: entries.map((entry) => entry.MessageBody ?? '') });
    const outcome: BatchOutcome = { sent: new Map(), failed: new Map() };
    entries.forEach((entry, index) => {
      sequence += 1;
      if (fail(entry)) outcome.failed.set(index, new Error(`refused ${entry.MessageBody}`));
      else outcome.sent.set(index, `id-${sequence}`);
    });
    return outcome;
  };
  return { calls, send: createSendBatcher(sendBatch) };
}

describe('the send batcher', () => {
  it('sends what one turn of the event loop issues together, per queue, ten at a time', async () => {
    const { calls, send } = recorder();
    const ids = await Promise.all([
      ...Array.from({ length: 12 }, (_, i) => send('a', { MessageBody: `a${i}` })),
      send('b', { MessageBody: 'b0' }),
    ]);
    expect(new Set(ids).size).toBe(13);
    // Queues flush independently, so only the order within one queue is fixed.
    expect(calls.filter((call) => call.queue === 'a').map((call) => call.bodies.length)).toEqual([10, 2]);
    expect(calls.filter((call) => call.queue === 'b').map((call) => call.bodies.length)).toEqual([1]);
  });

  it('sends sends from separate turns separately', async () => {
    const { calls, send } = recorder();
    await send('a', { MessageBody: 'first' });
    await send('a', { MessageBody: 'second' });
    expect(calls.map((call) => call.bodies)).toEqual([['first'], ['second']]);
  });

  it('keeps each batch within the payload limit', async () => {
    const { calls, send } = recorder();
    const big = 'x'.repeat(MAX_BATCH_BYTES / 2 + 1);
    await Promise.all([
      send('a', { MessageBody: big }),
      send('a', { MessageBody: big }),
      send('a', { MessageBody: 'small' }),
    ]);
    expect(calls.map((call) => call.bodies.length)).toEqual([1, 2]);
  });

  it('fails only the caller whose entry was refused', async () => {
    const { send } = recorder((entry) => entry.MessageBody === 'bad');
    const results = await Promise.allSettled([
      send('a', { MessageBody: 'good' }),
      send('a', { MessageBody: 'bad' }),
    ]);
    expect(results[0]).toMatchObject({ status: 'fulfilled' });
    expect(results[1]).toMatchObject({ status: 'rejected', reason: { message: 'refused bad' } });
  });

  it('fails every caller of a batch whose call failed', async () => {
    const send = createSendBatcher(async () => {
      throw new Error('endpoint down');
    });
    const results = await Promise.allSettled([
      send('a', { MessageBody: '1' }),
      send('a', { MessageBody: '2' }),
    ]);
    expect(results.map((result) => result.status)).toEqual(['rejected', 'rejected']);
  });
});
