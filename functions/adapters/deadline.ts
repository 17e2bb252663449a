/**
 * A signal that aborts when `timeoutMs` has passed or when the caller's signal aborts, and that
 * lets go of everything the moment the work is over (`dispose`).
 *
 * Why not `AbortSignal.any([caller, AbortSignal.timeout(ms)])`: Node keeps a timeout signal
 * handed to `AbortSignal.any`, and the composite signal with it, strongly referenced until the
 * timer fires, whether or not the work has long finished (Node 22: both go into its
 * `gcPersistentSignals` set). With the provisioner's 120 s delete timeout every release kept its
 * signals, and what they reference, for two minutes after its DELETE was answered: about 3 KiB
 * per cleanup, 600 of them in the benchmark's heap after 600 cleanups (bench/README.md, memory).
 * Here the timer is cleared and the listener on the caller's signal removed as soon as the
 * caller is done, so nothing outlives the request.
 */
export interface Deadline {
  readonly signal: AbortSignal;
  /** True once the timeout (not the caller's signal) aborted `signal`. */
  readonly expired: boolean;
  /** Clears the timer and stops listening to the caller's signal; idempotent. */
  dispose(): void;
}

/** The reason `AbortSignal.timeout` gives, so callers and undici see the same error as before. */
function timeoutReason(): DOMException {
  return new DOMException('The operation was aborted due to timeout', 'TimeoutError');
}

export function startDeadline(timeoutMs: number, callerSignal?: AbortSignal): Deadline {
  const controller = new AbortController();
  let expired = false;
  const timer = setTimeout(() => {
    if (controller.signal.aborted) return;
    expired = true;
    controller.abort(timeoutReason());
  }, timeoutMs);
  // Like AbortSignal.timeout's timer, it does not keep the process alive on its own.
  timer.unref();
  const follow = () => controller.abort(callerSignal?.reason);
  if (callerSignal?.aborted) follow();
  else callerSignal?.addEventListener('abort', follow, { once: true });
  return {
    signal: controller.signal,
    get expired() {
      return expired;
    },
    dispose() {
      clearTimeout(timer);
      callerSignal?.removeEventListener('abort', follow);
    },
  };
}
