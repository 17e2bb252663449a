/**
 * Structured JSON logs (Powertools Logger) and CloudWatch metrics in embedded metric format
 * (Powertools Metrics), both to stdout: in Lambda CloudWatch picks them up, in the local stack
 * the demo reads the same lines.
 */
import { Logger } from '@aws-lambda-powertools/logger';
import { Metrics, MetricUnit } from '@aws-lambda-powertools/metrics';
import { METRICS_NAMESPACE, type MetricName } from './metric-names.ts';
import { redactSecrets } from './redact.ts';

export const SERVICE_NAME = 'runtime-cleanup';

export interface Telemetry {
  readonly logger: Logger;
  readonly metrics: Metrics;
  /** A count with dimensions, published at once as its own EMF document (safe across concurrent records). */
  count(name: MetricName, dimensions?: Record<string, string>, value?: number): void;
  /** A duration in milliseconds, with optional dimensions, published at once. */
  milliseconds(name: MetricName, value: number, dimensions?: Record<string, string>): void;
  seconds(name: MetricName, value: number, dimensions?: Record<string, string>): void;
}

export function createTelemetry(options: {
  functionName: string;
  stage?: string;
  logLevel?: string;
}): Telemetry {
  const stage = options.stage ?? process.env.STAGE ?? 'local';
  const logger = new Logger({
    serviceName: SERVICE_NAME,
    logLevel: (options.logLevel ?? process.env.LOG_LEVEL ?? 'INFO') as 'INFO',
    persistentKeys: { stage, function: options.functionName },
    // Secrets (database passwords, tokens in URLs) never reach a log line, error messages included.
    jsonReplacerFn: (_key, value) => (typeof value === 'string' ? redactSecrets(value) : value),
  });
  const metrics = new Metrics({
    namespace: METRICS_NAMESPACE,
    serviceName: SERVICE_NAME,
    defaultDimensions: { stage, function: options.functionName },
    // Powertools' own notices (e.g. "no application metrics to publish" when a concurrent
    // invocation in the local stack flushed first) as JSON log lines, not bare console text.
    logger: {
      debug: (...args: unknown[]) => logger.debug(String(args[0])),
      info: (...args: unknown[]) => logger.debug(String(args[0])),
      warn: (...args: unknown[]) => logger.debug(String(args[0])),
      error: (...args: unknown[]) => logger.error(String(args[0])),
    },
  });
  const emit = (
    name: MetricName,
    unit: (typeof MetricUnit)[keyof typeof MetricUnit],
    value: number,
    dimensions: Record<string, string> = {},
  ) => {
    const single = metrics.singleMetric();
    for (const [key, dimension] of Object.entries(dimensions)) single.addDimension(key, dimension);
    single.addMetric(name, unit, value);
  };
  return {
    logger,
    metrics,
    count: (name, dimensions, value = 1) => emit(name, MetricUnit.Count, value, dimensions),
    milliseconds: (name, value, dimensions) => emit(name, MetricUnit.Milliseconds, value, dimensions),
    seconds: (name, value, dimensions) => emit(name, MetricUnit.Seconds, value, dimensions),
  };
}
