/**
 * What the functions print, as CloudWatch would read it: every JSON line written to stdout and
 * stderr while `work` runs (hidden from the test output), and the EMF metric documents among them.
 */
export async function captureStdout(work: () => Promise<void>): Promise<Record<string, unknown>[]> {
  return jsonLines(await captureOutput(work));
}

/** The JSON lines of captured output, parsed. */
export function jsonLines(output: string): Record<string, unknown>[] {
  return output
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

/** Everything written to stdout and stderr while `work` runs, as one text (hidden from the test output). */
export async function captureOutput(work: () => Promise<void>): Promise<string> {
  const streams = [process.stdout, process.stderr];
  const originals = streams.map((stream) => stream.write.bind(stream));
  let buffer = '';
  for (const stream of streams) {
    stream.write = ((chunk: string | Uint8Array) => {
      buffer += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
      return true;
    }) as typeof stream.write;
  }
  try {
    await work();
  } finally {
    streams.forEach((stream, index) => {
      stream.write = originals[index]!;
    });
  }
  return buffer;
}

/** The metrics of EMF documents, one entry per metric, with its dimensions' values. */
export function emfMetrics(lines: Record<string, unknown>[]) {
  return lines
    .filter((line) => line._aws)
    .flatMap((line) => {
      const aws = line._aws as {
        CloudWatchMetrics: Array<{
          Namespace: string;
          Dimensions: string[][];
          Metrics: Array<{ Name: string; Unit: string }>;
        }>;
      };
      return aws.CloudWatchMetrics.flatMap((directive) =>
        directive.Metrics.map((metric) => ({
          namespace: directive.Namespace,
          name: metric.Name,
          unit: metric.Unit,
          dimensions: Object.fromEntries(directive.Dimensions.flat().map((key) => [key, line[key]])),
          value: line[metric.Name],
        })),
      );
    });
}
