/**
 * The functions publish CloudWatch metrics as EMF JSON lines on stdout, as in Lambda. The
 * benchmark keeps metrics on (their serialisation is part of what a cleanup costs) but counts and
 * drops those lines instead of printing thousands of them. Turning metrics off instead
 * (POWERTOOLS_METRICS_DISABLED) would both skip that cost and make every invocation warn
 * "No application metrics to publish".
 */
export interface EmfSink {
  /** EMF lines swallowed so far. */
  lines(): number;
  restore(): void;
}

const EMF_PREFIX = '{"_aws":';

export function swallowEmfLines(): EmfSink {
  const original = process.stdout.write.bind(process.stdout);
  let count = 0;
  const write = ((chunk: unknown, ...rest: unknown[]) => {
    if (typeof chunk === 'string' && chunk.startsWith(EMF_PREFIX)) {
      count += 1;
      const callback = rest.find((arg) => typeof arg === 'function') as (() => void) | undefined;
      callback?.();
      return true;
    }
    return (original as (...args: unknown[]) => boolean)(chunk, ...rest);
  }) as typeof process.stdout.write;
  process.stdout.write = write;
  return {
    lines: () => count,
    restore() {
      if (process.stdout.write === write) process.stdout.write = original;
    },
  };
}
