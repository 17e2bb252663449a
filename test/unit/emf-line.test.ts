import { Metrics, MetricUnit } from '@aws-lambda-powertools/metrics';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { METRICS_NAMESPACE, MetricName } from '../../functions/adapters/metric-names.ts';
import { createTelemetry, SERVICE_NAME } from '../../functions/adapters/observability.ts';
import { captureStdout } from '../support/capture.ts';

/**
 * The functions write their per-event metrics as EMF lines of their own (observability.ts) rather
 * than through Powertools' singleMetric(), for CPU. Alarms and dashboards key on the exact
 * namespace, dimension set and values, so the lines must be the ones Powertools would write:
 * compared here document for document (the timestamp aside) against Powertools itself.
 */
const saved = { ...process.env };
beforeEach(() => {
  process.env.POWERTOOLS_METRICS_DISABLED = 'false';
  delete process.env.POWERTOOLS_DEV;
});
afterEach(() => {
  // Key by key: the environment object itself stays the one Node and Vitest hold (files share a worker).
  for (const key of Object.keys(process.env)) if (!(key in saved)) delete process.env[key];
  Object.assign(process.env, saved);
});

const withoutTimestamp = (line: Record<string, unknown>) => {
  const aws = line._aws as Record<string, unknown>;
  expect(typeof aws.Timestamp).toBe('number');
  return { ...line, _aws: { ...aws, Timestamp: 0 } };
};

describe('per-event metric lines', () => {
  it('are the documents Powertools singleMetric() writes: namespace, dimension set, values', async () => {
    const cases: Array<
      [MetricName, (typeof MetricUnit)[keyof typeof MetricUnit], number, Record<string, string>]
    > = [
      [MetricName.RELEASE_SKIPPED, MetricUnit.Count, 1, { reason: 'fence_gone' }],
      [MetricName.RELEASE_DURATION, MetricUnit.Milliseconds, 12.5, {}],
      [
        MetricName.RELEASE_FAILED,
        MetricUnit.Count,
        3,
        { errorCode: 'PROVISIONER_TIMEOUT', phase: 'release' },
      ],
      // A dimension without a value is left out by both.
      [MetricName.RELEASE_SUCCEEDED, MetricUnit.Count, 1, { outcome: '' }],
      // So is one whose name or value is only blanks, or whose value is not a string (a value that
      // reaches the line from data or from JavaScript that the types did not check).
      [MetricName.RELEASE_SKIPPED, MetricUnit.Count, 1, { reason: ' ', phase: 'release' }],
      [MetricName.RELEASE_SKIPPED, MetricUnit.Count, 1, { ' ': 'blank name' }],
      [MetricName.RELEASE_FAILED, MetricUnit.Count, 1, { errorCode: 7 as unknown as string }],
      [MetricName.RELEASE_FAILED, MetricUnit.Count, 1, { errorCode: undefined as unknown as string }],
      // A metric's own dimension named like a fixed one replaces its value and keeps its place.
      [MetricName.RELEASE_SKIPPED, MetricUnit.Count, 1, { stage: 'other', service: 'x' }],
    ];
    const ours = await captureStdout(async () => {
      const telemetry = createTelemetry({ functionName: 'release', stage: 'test' });
      for (const [name, unit, value, dimensions] of cases) {
        if (unit === MetricUnit.Milliseconds) telemetry.milliseconds(name, value, dimensions);
        else telemetry.count(name, dimensions, value);
      }
    });
    const reference = await captureStdout(async () => {
      const metrics = new Metrics({
        namespace: METRICS_NAMESPACE,
        serviceName: SERVICE_NAME,
        defaultDimensions: { stage: 'test', function: 'release' },
        logger: { debug() {}, info() {}, warn() {}, error() {} },
      });
      for (const [name, unit, value, dimensions] of cases) {
        const single = metrics.singleMetric();
        for (const [key, dimension] of Object.entries(dimensions)) single.addDimension(key, dimension);
        single.addMetric(name, unit, value);
      }
    });
    expect(reference).toHaveLength(cases.length);
    expect(ours.filter((line) => line._aws).map(withoutTimestamp)).toEqual(reference.map(withoutTimestamp));
  });

  it('are not written where Powertools metrics are disabled (POWERTOOLS_METRICS_DISABLED, else POWERTOOLS_DEV)', async () => {
    const written = async (env: Record<string, string | undefined>) => {
      for (const [key, value] of Object.entries(env)) {
        if (value === undefined) delete process.env[key];
        else process.env[key] = value;
      }
      const lines = await captureStdout(async () => {
        createTelemetry({ functionName: 'release', stage: 'test' }).count(MetricName.RELEASE_SKIPPED);
      });
      return lines.filter((line) => line._aws).length;
    };
    expect(await written({ POWERTOOLS_METRICS_DISABLED: 'true' })).toBe(0);
    expect(await written({ POWERTOOLS_METRICS_DISABLED: undefined, POWERTOOLS_DEV: 'true' })).toBe(0);
    expect(await written({ POWERTOOLS_METRICS_DISABLED: 'false', POWERTOOLS_DEV: 'true' })).toBe(1);
    expect(await written({ POWERTOOLS_METRICS_DISABLED: undefined, POWERTOOLS_DEV: undefined })).toBe(1);
  });
});
