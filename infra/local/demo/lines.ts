/**
 * The two kinds of line the demo reads from the captured output, and the demo platform's own
 * log lines (it logs the way the functions do, so one reader handles both):
 *
 * - a structured log line (Powertools Logger): `{"level","message","timestamp",...keys}`;
 * - an EMF metric line (Powertools Metrics): `{"_aws":{"Timestamp","CloudWatchMetrics":[{
 *   "Dimensions":[[...]],"Metrics":[{"Name","Unit"}]}]}, <dimension>: "...", <metric>: n | n[]}`.
 */
export interface LogLine {
  readonly kind: 'log';
  readonly level: string;
  readonly message: string;
  /** `function` key: fence-check, release, finalize, sweeper, or `platform` for the demo's own. */
  readonly source: string;
  /** Epoch milliseconds. */
  readonly at: number;
  readonly fields: Readonly<Record<string, unknown>>;
}

export interface MetricLine {
  readonly kind: 'metric';
  readonly source: string;
  readonly at: number;
  /** Dimension name → value, as listed in the document's dimension set. */
  readonly dimensions: Readonly<Record<string, string>>;
  /** Metric name → its values in this document. */
  readonly values: Readonly<Record<string, readonly number[]>>;
}

export type ParsedLine = LogLine | MetricLine;

/** The `function` of the demo platform's own lines. */
export const PLATFORM_SOURCE = 'platform';

/** Messages of the demo platform's log lines. */
export const PlatformMessage = {
  RUN_ADMITTED: 'run admitted',
  ADMISSION_REFUSED: 'admission refused; scope fenced',
  SUBAGENT_STARTED: 'subagent started',
  SUBAGENT_FINISHED: 'subagent finished',
  RUN_FINISHED: 'run finished',
  LEASE_ROUND: 'lease round',
  WORKLOAD_FINISHED: 'workload finished',
  FAULTS_STOPPED: 'faults stopped',
  STACK_ERROR: 'stack component error',
  SANDBOX_LEAKED: 'platform crashed between creating a sandbox and recording it; sandbox leaked',
} as const;

/** Messages of the functions' log lines the demo follows (functions/{fence-check,release,finalize,sweeper}). */
export const FunctionMessage = {
  RELEASE_REQUESTED: 'fence checked; release requested',
  NOTHING_TO_DELETE: 'fence checked; no live sandbox, finalizing',
  FENCE_CHECK_DEFERRED: 'fence check deferred; scope still active',
  SANDBOX_RELEASED: 'sandbox released',
  ATTEMPT_FAILED: 'attempt failed; will retry',
  DEAD_LETTERED: 'message dead-lettered',
  FENCE_CLEARED: 'fence cleared',
  FENCE_ALREADY_CLEAR: 'fence already clear',
  FINALIZE_DEFERRED: 'finalize deferred; scope still active',
  IDENTITY_CHANGED: 'identity changed since the fence check; fence kept, restarting at phase 1',
  SWEEP_FINISHED: 'sweep finished',
  SANDBOX_RECLAIMED: 'leaked sandbox reclaimed',
  RECLAIM_FINISHED: 'reclaim finished',
} as const;

export function parseLine(json: Record<string, unknown>): ParsedLine | undefined {
  const aws = json._aws as { Timestamp?: unknown; CloudWatchMetrics?: unknown } | undefined;
  if (aws && Array.isArray(aws.CloudWatchMetrics)) return parseMetric(json, aws);
  if (typeof json.message === 'string' && typeof json.level === 'string') {
    const at = typeof json.timestamp === 'string' ? Date.parse(json.timestamp) : Number.NaN;
    return {
      kind: 'log',
      level: json.level,
      message: json.message,
      source: typeof json.function === 'string' ? json.function : 'unknown',
      at: Number.isFinite(at) ? at : Date.now(),
      fields: json,
    };
  }
  return undefined;
}

function parseMetric(
  json: Record<string, unknown>,
  aws: { Timestamp?: unknown; CloudWatchMetrics?: unknown },
): MetricLine {
  const directives = aws.CloudWatchMetrics as Array<{
    Dimensions?: unknown;
    Metrics?: Array<{ Name?: unknown }>;
  }>;
  const dimensions: Record<string, string> = {};
  const values: Record<string, number[]> = {};
  for (const directive of directives) {
    for (const set of Array.isArray(directive.Dimensions) ? directive.Dimensions : []) {
      for (const key of Array.isArray(set) ? set : []) {
        if (typeof key === 'string' && typeof json[key] === 'string') dimensions[key] = json[key] as string;
      }
    }
    for (const metric of directive.Metrics ?? []) {
      if (typeof metric.Name !== 'string') continue;
      const raw = json[metric.Name];
      const list = (Array.isArray(raw) ? raw : [raw]).filter(
        (value): value is number => typeof value === 'number' && Number.isFinite(value),
      );
      values[metric.Name] = list;
    }
  }
  return {
    kind: 'metric',
    source: typeof json.function === 'string' ? json.function : 'unknown',
    at: typeof aws.Timestamp === 'number' ? aws.Timestamp : Date.now(),
    dimensions,
    values,
  };
}

/** A field as a string, when it is one. */
export function text(fields: Readonly<Record<string, unknown>>, key: string): string | undefined {
  const value = fields[key];
  return typeof value === 'string' ? value : undefined;
}

/** A field as a finite number, when it is one. */
export function number(fields: Readonly<Record<string, unknown>>, key: string): number | undefined {
  const value = fields[key];
  return typeof value === 'number' && Number.isFinite(value) ? value : undefined;
}
