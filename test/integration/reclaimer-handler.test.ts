/**
 * The reclaimer as deployed (its composition root, wrapped like the Lambda entry point) against a
 * real database and the real local provisioner: what it logs for each reclaim, and the metrics it
 * emits, with exactly the dimensions its alarms (infra/serverless/alarms.cjs) watch.
 */
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import { withObservability } from '../../functions/adapters/lambda.ts';
import { MetricName } from '../../functions/adapters/metric-names.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import type { Queues } from '../../functions/adapters/queues.ts';
import { composeReclaimer } from '../../functions/reclaimer/handler.ts';
import { localLambdaContext } from '../../infra/local/event-source.ts';
import { captureStdout, emfMetrics } from '../support/capture.ts';
import { upsertSandbox } from '../support/factories.ts';
import { useProvisionerFixture } from '../support/fixtures.ts';
import { testInfrastructure } from '../support/infrastructure.ts';

const fixture = useProvisionerFixture({ tempPrefix: 'reclaimer-', graceMs: 200 });

beforeAll(() => {
  process.env.POWERTOOLS_METRICS_DISABLED = 'false';
});
afterAll(() => {
  process.env.POWERTOOLS_METRICS_DISABLED = 'true';
});

async function reclaimer(env: Record<string, string>) {
  const config = loadConfig({ SANDBOX_PROVISIONER_URL: fixture.provisioner.url, ...env });
  const telemetry = createTelemetry({ functionName: 'reclaimer', stage: 'test', logLevel: 'INFO' });
  const composed = await composeReclaimer(
    testInfrastructure({ config, db: fixture.t.db, queues: {} as Queues, telemetry }),
  );
  onTestFinished(() => composed.close());
  const handler = withObservability(composed.handler, composed.telemetry);
  return () => handler({}, localLambdaContext('reclaimer', 900));
}

async function post(sandboxId: string): Promise<void> {
  const response = await fetch(new URL('/api/sandboxes', fixture.provisioner.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ sandbox_id: sandboxId, thread_id: 't', user_id: 'u' }),
  });
  await response.body?.cancel();
}

const RECLAIMER_DIMENSIONS = { service: 'runtime-cleanup', stage: 'test', function: 'reclaimer' };

describe('the reclaimer function', () => {
  it('logs each reclaim with the sandbox and why, and emits the metrics its alarms and dashboard read', async () => {
    await fixture.t.db.query('DELETE FROM runtime_reclaim_sightings');
    await post('sbx-handler-leak');
    const run = await reclaimer({ RECLAIM_GRACE_SECONDS: '1', RECLAIM_MAX_SHARE_PERCENT: '100' });
    const first = await captureStdout(async () => {
      expect(await run()).toMatchObject({ listed: 1, leaked: 1, reclaimed: 0 });
    });
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    const second = await captureStdout(async () => {
      expect(await run()).toMatchObject({ listed: 1, leaked: 1, reclaimed: 1 });
    });
    expect(fixture.provisioner.sandbox('sbx-handler-leak')).toBeUndefined();

    const reclaimedLine = second.find((line) => line.message === 'leaked sandbox reclaimed');
    expect(reclaimedLine).toMatchObject({
      function: 'reclaimer',
      sandboxId: 'sbx-handler-leak',
      leakReason: 'unrecorded',
      outcome: 'deleted',
    });
    const metrics = emfMetrics([...first, ...second]);
    const find = (name: string) => metrics.filter((metric) => metric.name === name);
    expect(find(MetricName.SANDBOXES_LISTED).at(-1)).toMatchObject({
      dimensions: RECLAIMER_DIMENSIONS,
      value: 1,
    });
    expect(find(MetricName.SANDBOXES_LEAKED).at(-1)).toMatchObject({
      dimensions: RECLAIMER_DIMENSIONS,
      value: 1,
    });
    expect(find(MetricName.SANDBOXES_RECLAIMED)[0]).toMatchObject({
      dimensions: { ...RECLAIMER_DIMENSIONS, reason: 'unrecorded' },
      value: 1,
    });
    // The alarms' series: exactly service, stage and function.
    expect(find(MetricName.OLDEST_LEAK_AGE).at(-1)).toMatchObject({
      dimensions: RECLAIMER_DIMENSIONS,
      unit: 'Seconds',
    });
    expect(find(MetricName.RECLAIM_REFUSED).at(-1)).toMatchObject({
      dimensions: RECLAIMER_DIMENSIONS,
      value: 0,
    });
  });

  it('a refused run deletes nothing, says why, and counts ReclaimRefused for the alarm and by reason', async () => {
    await fixture.t.db.query('DELETE FROM runtime_reclaim_sightings');
    for (let i = 0; i < 10; i += 1) await post(`sbx-runaway-${i}`);
    // One of them is named by a row (this database knows the fleet): the share rule decides.
    await upsertSandbox(fixture.t.db, {
      uid: 'user-runaway',
      runtimeScopeId: 'scope-runaway',
      sandboxId: 'sbx-runaway-0',
      generation: 1,
    });
    const run = await reclaimer({ RECLAIM_GRACE_SECONDS: '1', RECLAIM_MAX_SHARE_PERCENT: '50' });
    const lines = await captureStdout(async () => {
      expect(await run()).toMatchObject({ refused: 'share_exceeded' });
    });
    expect(
      lines.find((line) => line.message === 'reclaim run refused: nothing recorded, nothing deleted'),
    ).toMatchObject({
      level: 'ERROR',
      reason: 'share_exceeded',
    });
    const refused = emfMetrics(lines).filter((metric) => metric.name === MetricName.RECLAIM_REFUSED);
    expect(refused).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ dimensions: RECLAIMER_DIMENSIONS, value: 1 }),
        expect.objectContaining({
          dimensions: { ...RECLAIMER_DIMENSIONS, reason: 'share_exceeded' },
          value: 1,
        }),
      ]),
    );
    for (let i = 0; i < 10; i += 1) expect(fixture.provisioner.sandbox(`sbx-runaway-${i}`)).toBeDefined();
  });
});
