/**
 * The provider's release lock: one holder per key, waiters served first come first served, and a
 * waiter that times out or is aborted leaves the queue for good (it must never be handed the lock
 * later, or the key would stay held by nobody).
 */
import { describe, expect, it, vi } from 'vitest';
import { KeyedLock } from '../../functions/cleanup/keyed-lock.ts';
import { rejectionOf } from '../support/probes.ts';

class TimedOut extends Error {}

const wait = (extra: { timeoutMs?: number; signal?: AbortSignal } = {}) => ({
  timeoutMs: extra.timeoutMs ?? 5_000,
  onTimeout: () => new TimedOut('lock wait timed out'),
  ...(extra.signal ? { signal: extra.signal } : {}),
});

/** Lets every already-settled promise callback run. */
const flush = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('KeyedLock', () => {
  it('grants a free key at once and holds it until released', async () => {
    const lock = new KeyedLock();
    const release = await lock.acquire('u:s', wait());
    expect(lock.isHeld('u:s')).toBe(true);
    release();
    expect(lock.isHeld('u:s')).toBe(false);
    expect(lock.heldKeys).toBe(0);
  });

  it('keeps keys independent', async () => {
    const lock = new KeyedLock();
    const first = await lock.acquire('u:a', wait());
    const second = await lock.acquire('u:b', wait({ timeoutMs: 10 }));
    expect(lock.heldKeys).toBe(2);
    first();
    second();
  });

  it('hands the key over to waiters in arrival order (FIFO), one at a time', async () => {
    const lock = new KeyedLock();
    const releaseHolder = await lock.acquire('k', wait());
    const order: string[] = [];
    const waiters = ['A', 'B', 'C'].map((name) =>
      lock.acquire('k', wait()).then((release) => {
        order.push(name);
        return release;
      }),
    );

    await flush();
    expect(order).toEqual([]);
    releaseHolder();
    const releaseA = await waiters[0]!;
    await flush();
    expect(order).toEqual(['A']);
    releaseA();
    const releaseB = await waiters[1]!;
    releaseB();
    const releaseC = await waiters[2]!;
    expect(order).toEqual(['A', 'B', 'C']);
    releaseC();
    expect(lock.heldKeys).toBe(0);
  });

  it('rejects a wait past its timeout with the caller-built error and drops the waiter from the queue', async () => {
    const lock = new KeyedLock();
    const releaseHolder = await lock.acquire('k', wait());

    const error = await rejectionOf(lock.acquire('k', wait({ timeoutMs: 20 })));

    expect(error).toBeInstanceOf(TimedOut);
    releaseHolder();
    // Had the timed-out waiter stayed queued, the key would now be "held" by it forever.
    expect(lock.isHeld('k')).toBe(false);
  });

  it('rejects an aborted wait with the signal reason and drops the waiter, letting the next one through', async () => {
    const lock = new KeyedLock();
    const releaseHolder = await lock.acquire('k', wait());
    const controller = new AbortController();
    const aborted = lock.acquire('k', wait({ signal: controller.signal }));
    const next = lock.acquire('k', wait());
    const reason = new Error('deadline');

    controller.abort(reason);
    expect(await rejectionOf(aborted)).toBe(reason);
    releaseHolder();
    const releaseNext = await next;
    expect(lock.isHeld('k')).toBe(true);
    releaseNext();
    expect(lock.isHeld('k')).toBe(false);
  });

  it('rejects at once, without queueing, a wait whose signal is already aborted', async () => {
    const lock = new KeyedLock();
    const releaseHolder = await lock.acquire('k', wait());
    const reason = new Error('already late');

    expect(await rejectionOf(lock.acquire('k', wait({ signal: AbortSignal.abort(reason) })))).toBe(reason);
    releaseHolder();
    expect(lock.isHeld('k')).toBe(false);
  });

  it('makes release idempotent: a second call does not release the next holder', async () => {
    const lock = new KeyedLock();
    const releaseFirst = await lock.acquire('k', wait());
    const second = lock.acquire('k', wait());
    let thirdGranted = false;
    const third = lock.acquire('k', wait()).then((release) => {
      thirdGranted = true;
      return release;
    });

    releaseFirst();
    const releaseSecond = await second;
    releaseFirst();
    await flush();

    expect(thirdGranted).toBe(false);
    releaseSecond();
    (await third)();
    expect(lock.heldKeys).toBe(0);
  });

  it('waits the full timeout before giving up, not less', async () => {
    vi.useFakeTimers();
    try {
      const lock = new KeyedLock();
      const releaseHolder = await lock.acquire('k', wait());
      let settled = false;
      const waiting = lock.acquire('k', wait({ timeoutMs: 1_000 }));
      const settle = () => {
        settled = true;
      };
      waiting.then(settle, settle);

      await vi.advanceTimersByTimeAsync(999);
      expect(settled).toBe(false);
      await vi.advanceTimersByTimeAsync(1);
      expect(await rejectionOf(waiting)).toBeInstanceOf(TimedOut);
      releaseHolder();
    } finally {
      vi.useRealTimers();
    }
  });
});
