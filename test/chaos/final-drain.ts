/**
 * The final drain: once every fault stopped, the system must come to rest by itself — no fence
 * up, nothing visible, in flight or delayed on a consumed queue — before the final checks judge it.
 */
import { preciseNow } from './clock.ts';

/** Resolves true once no fence is up and every consumed queue is empty, false at the deadline. */
export async function drainAfterFaults(input: {
  countFences: () => Promise<number>;
  queueDepths: () => Promise<number[]>;
  deadlineMs: number;
}): Promise<boolean> {
  while (preciseNow() < input.deadlineMs) {
    // Empty queues (nothing visible, in flight or delayed): every message was taken off, by an
    // acknowledgement or by SQS's own redrive; the final check tells which.
    const [fences, depths] = await Promise.all([input.countFences(), input.queueDepths()]);
    if (fences === 0 && depths.every((depth) => depth === 0)) return true;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return false;
}
