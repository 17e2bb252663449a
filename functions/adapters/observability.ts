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

/** Powertools Metrics, with whether it is disabled (settled from the environment when made) readable. */
class FunctionMetrics extends Metrics {
  get metricsDisabled(): boolean {
    return this.isDisabled();
  }
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
  const metrics = new FunctionMetrics({
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
  // One EMF document per metric, written directly: the same line Powertools' singleMetric()
  // writes (a unit test compares them), without building a Metrics instance per metric (its
  // constructor re-reads a dozen environment variables and makes a Console): in the benchmark's
  // profile that was about a tenth of a cleanup's CPU. Disabled exactly when the stored-metrics
  // instance is (POWERTOOLS_METRICS_DISABLED, else POWERTOOLS_DEV).
  const fixedDimensions: Record<string, string> = {
    service: SERVICE_NAME,
    stage,
    function: options.functionName,
  };
  const emit = (
    name: MetricName,
    unit: (typeof MetricUnit)[keyof typeof MetricUnit],
    value: number,
    dimensions: Record<string, string> = {},
  ) => {
    if (metrics.metricsDisabled) return;
    process.stdout.write(`${emfLine(name, unit, value, fixedDimensions, dimensions)}\n`);
  };
  return {
    logger,
    metrics,
    count: (name, dimensions, value = 1) => emit(name, MetricUnit.Count, value, dimensions),
    milliseconds: (name, value, dimensions) => emit(name, MetricUnit.Milliseconds, value, dimensions),
    seconds: (name, value, dimensions) => emit(name, MetricUnit.Seconds, value, dimensions),
  };
}

/**
 * One CloudWatch embedded-metric-format document for one metric, as Powertools' singleMetric()
 * serialises it: the namespace, one dimension set (the fixed dimensions, then the metric's own),
 * the dimensions' values and the metric's value. A dimension Powertools' addDimension() refuses is
 * left out here too: a name or value that is not a string, or is empty or only blanks (a blank
 * dimension would start a series of its own in CloudWatch).
 */
export function emfLine(
  name: string,
  unit: string,
  value: number,
  fixedDimensions: Record<string, string>,
  dimensions: Record<string, string>,
): string {
  const values: Record<string, string | number> = { ...fixedDimensions };
  for (const [key, dimension] of Object.entries(dimensions)) {
    if (nonBlank(key) && nonBlank(dimension)) values[key] = dimension;
  }
  return JSON.stringify({
    _aws: {
      Timestamp: Date.now(),
      CloudWatchMetrics: [
        {
          Namespace: METRICS_NAMESPACE,
          Dimensions: [Object.keys(values)],
          Metrics: [{ Name: name, Unit: unit }],
        },
      ],
    },
    ...values,
    [name]: value,
  });
}

/** What Powertools accepts as a dimension name or value (its isStringUndefinedNullEmpty, negated). */
function nonBlank(value: unknown): value is string {
  return typeof value === 'string' && value.trim().length > 0;
}
