/**
 * An in-process mutex per key (`uid:scope`) with a bounded, abortable wait: the provider's
 * release lock. The old design waited on it forever while holding database locks; here a wait
 * past its bound rejects, and the caller never calls the provisioner.
 *
 * Across processes the same exclusion comes from the FIFO release queue's message group.
 */
export interface LockWaitOptions {
  timeoutMs: number;
  signal?: AbortSignal;
  /** Builds the error thrown when the wait times out (the caller knows the key's meaning). */
  onTimeout: () => Error;
}

interface Waiter {
  grant: () => void;
}

export class KeyedLock {
  readonly #queues = new Map<string, Waiter[]>();

  /** Number of keys currently held (for tests and metrics). */
  get heldKeys(): number {
    return this.#queues.size;
  }

  isHeld(key: string): boolean {
    return this.#queues.has(key);
  }

  /** Resolves with a release function once the key is ours; release is idempotent. */
  acquire(key: string, options: LockWaitOptions): Promise<() => void> {
    if (options.signal?.aborted) return Promise.reject(options.signal.reason);
    const queue = this.#queues.get(key);
    if (!queue) {
      this.#queues.set(key, []);
      return Promise.resolve(this.#releaser(key));
    }
    return new Promise((resolve, reject) => {
      const signal = options.signal;
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const leave = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        const index = queue.indexOf(waiter);
        if (index >= 0) queue.splice(index, 1);
      };
      const onAbort = () => {
        leave();
        reject(signal?.reason);
      };
      const waiter: Waiter = {
        grant: () => {
          leave();
          resolve(this.#releaser(key));
        },
      };
      const timer = setTimeout(() => {
        leave();
        reject(options.onTimeout());
      }, options.timeoutMs);
      signal?.addEventListener('abort', onAbort, { once: true });
      queue.push(waiter);
    });
  }

  #releaser(key: string): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const queue = this.#queues.get(key);
      const next = queue?.shift();
      if (next) next.grant();
      else this.#queues.delete(key);
    };
  }
}
