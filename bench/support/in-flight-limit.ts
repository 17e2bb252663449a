/**
 * At most `limit` calls of the returned wrapper run at once; the rest wait in arrival order. Part 1
 * uses it to model one deployed function instance, which processes one SQS batch (up to 10
 * records, in parallel) at a time. `undefined` means no limit.
 */
export function limitInFlight(limit: number | undefined): <T>(work: () => Promise<T>) => Promise<T> {
  if (limit === undefined) return (work) => work();
  let inFlight = 0;
  const waiting: Array<() => void> = [];
  return async (work) => {
    if (inFlight >= limit) await new Promise<void>((resolve) => waiting.push(resolve));
    else inFlight += 1;
    try {
      return await work();
    } finally {
      // Hand the slot straight to the next waiter, so a newcomer cannot overtake it.
      const next = waiting.shift();
      if (next) next();
      else inFlight -= 1;
    }
  };
}
