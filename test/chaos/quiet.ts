/**
 * The local stack shares one Powertools Metrics object per function between its concurrent
 * pollers, so an invocation often flushes metrics another one already flushed and Powertools warns
 * "No application metrics to publish" on stderr — hundreds of times in a chaos run. This drops
 * exactly that line (and nothing else) from this process's stderr, to keep the output readable.
 */
const EMPTY_METRICS_WARNING = 'No application metrics to publish';

export function silenceEmptyMetricsWarning(): () => void {
  const original = process.stderr.write.bind(process.stderr);
  const filtered = ((chunk: unknown, ...rest: unknown[]) => {
    if (typeof chunk === 'string' && chunk.includes(EMPTY_METRICS_WARNING)) return true;
    if (Buffer.isBuffer(chunk) && chunk.includes(EMPTY_METRICS_WARNING)) return true;
    return (original as (...args: unknown[]) => boolean)(chunk, ...rest);
  }) as typeof process.stderr.write;
  process.stderr.write = filtered;
  return () => {
    process.stderr.write = original;
  };
}
