import { describe, expect, it } from 'vitest';
import { startDeadline } from '../../functions/adapters/deadline.ts';

/** The provisioner client's request signal (functions/adapters/deadline.ts). */
describe('startDeadline', () => {
  it('aborts at the timeout with a TimeoutError, and says the deadline expired', async () => {
    const deadline = startDeadline(5);
    await new Promise((resolve) => deadline.signal.addEventListener('abort', resolve));
    expect(deadline.expired).toBe(true);
    expect((deadline.signal.reason as DOMException).name).toBe('TimeoutError');
    deadline.dispose();
  });

  it("follows the caller's signal with the caller's reason; that is not an expiry", () => {
    const caller = new AbortController();
    const deadline = startDeadline(60_000, caller.signal);
    const reason = new Error('the release deadline');
    caller.abort(reason);
    expect(deadline.signal.aborted).toBe(true);
    expect(deadline.signal.reason).toBe(reason);
    expect(deadline.expired).toBe(false);
    deadline.dispose();
  });

  it("starts aborted when the caller's signal already is", () => {
    const caller = new AbortController();
    caller.abort(new Error('gone'));
    const deadline = startDeadline(60_000, caller.signal);
    expect(deadline.signal.aborted).toBe(true);
    deadline.dispose();
  });

  it("once disposed, neither the timer nor the caller's signal aborts it", async () => {
    const caller = new AbortController();
    const deadline = startDeadline(5, caller.signal);
    deadline.dispose();
    await new Promise((resolve) => setTimeout(resolve, 20));
    caller.abort(new Error('later'));
    expect(deadline.signal.aborted).toBe(false);
    expect(deadline.expired).toBe(false);
  });
});
