/**
 * The coverage cycle forces one fault kind on each of the first runs. A forced fault must fire,
 * whatever the load: its run keeps its faults up until the fault's trigger point was reached (and
 * says so in its record), instead of lifting them when a timer says the window is over. Waiting
 * is bounded; a forced fault that never fires is a harness error with its kind and run, not a
 * count of 0 discovered at the end.
 *
 * How each kind is known to have fired:
 * - provisioner faults: a DELETE of the run's sandbox was handled with the fault applied
 *   (watchDeleteFaulted, registered before any DELETE can arrive);
 * - crashes at a step boundary: the boundary's send was reached and thrown (MessageLog);
 * - dropped acknowledgements: every one armed was dropped (MessageLog);
 * - duplicate delivery: a replay was sent (its candidate message awaited, see run-driver.ts);
 * - a re-provisioned sandbox: done while the finalize publish after the DELETE is held;
 * - the rest (locks held, admissions, Workdir changes, late children, a concurrent root, hostile
 *   messages, a lost announcement): done by the run itself within its window, noted as done.
 */
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';

export interface ForcedFaultRecord {
  kind: string;
  fired: boolean;
  /** How long after the planned end of the window the run waited for it. */
  waitedMs: number;
}

/**
 * Resolves once a DELETE of `sandboxId` was handled with a fault of the provisioner's table
 * applied. The provisioner calls its request hooks (the engine's lock probe first, then this) and
 * chooses the fault right after the last one returns, in the same turn of the event loop; a check
 * on the next turn (setImmediate) sees the fault's label in the audit. Register before the first
 * DELETE can arrive, and call `stop` when done.
 */
export function watchDeleteFaulted(
  provisioner: LocalProvisioner,
  sandboxId: string,
): { fired: Promise<void>; stop: () => void } {
  let resolveFired!: () => void;
  const fired = new Promise<void>((resolve) => {
    resolveFired = resolve;
  });
  const faulted = () =>
    provisioner
      .audit()
      .some(
        (entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId && entry.fault !== undefined,
      );
  const stop = provisioner.onRequest((info) => {
    if (info.method !== 'DELETE' || info.sandboxId !== sandboxId) return;
    setImmediate(() => {
      if (!faulted()) return;
      stop();
      resolveFired();
    });
  });
  return { fired, stop };
}

/** `work` settles to whether it fired by `deadlineMs` (this process's clock, ms). */
export async function firedBy(work: Promise<unknown>, deadlineMs: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => {
    timer = setTimeout(
      () => resolve(false),
      Math.max(0, deadlineMs - performance.timeOrigin - performance.now()),
    );
  });
  try {
    return await Promise.race([work.then(() => true as const), late]);
  } finally {
    clearTimeout(timer);
  }
}
