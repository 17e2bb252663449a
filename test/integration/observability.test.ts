/**
 * What an on-call engineer sees in CloudWatch: the JSON log lines and EMF metric documents the
 * real handlers print, captured from stdout while one cleanup runs through all three phases.
 */
import { ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import type { SQSEvent } from 'aws-lambda';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import type { ComposedFunction } from '../../functions/adapters/infrastructure.ts';
import { withObservability } from '../../functions/adapters/lambda.ts';
import { METRICS_NAMESPACE, MetricName } from '../../functions/adapters/metric-names.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { composeFenceCheck } from '../../functions/fence-check/handler.ts';
import { composeFinalize } from '../../functions/finalize/handler.ts';
import { composeRelease } from '../../functions/release/handler.ts';
import { localLambdaContext, toSqsRecord } from '../../infra/local/event-source.ts';
import { captureStdout, emfMetrics } from '../support/capture.ts';
import { finishedRootRun } from '../support/factories.ts';
import { useProvisionerFixture, useSqsFixture } from '../support/fixtures.ts';
import { testInfrastructure } from '../support/infrastructure.ts';

const fixture = useProvisionerFixture({ tempPrefix: 'observability-', graceMs: 200 });
const sqsFixture = useSqsFixture();
const SECRET = 's3cr3t-Pa55w0rd';

beforeAll(() => {
  process.env.POWERTOOLS_METRICS_DISABLED = 'false';
  // Lambda sets this; Powertools counts a cold start only when it says 'on-demand'.
  process.env.AWS_LAMBDA_INITIALIZATION_TYPE = 'on-demand';
});
afterAll(() => {
  process.env.POWERTOOLS_METRICS_DISABLED = 'true';
});

async function takeOne(queue: string): Promise<SQSEvent> {
  const url = await sqsFixture.queues.url(queue);
  for (let i = 0; i < 50; i += 1) {
    const { Messages } = await sqsFixture.sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: url,
        MaxNumberOfMessages: 1,
        MessageSystemAttributeNames: ['All'],
      }),
    );
    if (Messages?.length)
      return { Records: Messages.map((m) => toSqsRecord(m, `arn:${queue}`, 'us-east-1')) };
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error(`nothing arrived on ${queue}`);
}

describe('logs and metrics of one cleanup', () => {
  it('emit EMF metrics with names, units and dimensions, and logs that carry the correlation keys', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await fetch(`${fixture.provisioner.url}/api/sandboxes`, {
      method: 'POST',
      body: JSON.stringify({ sandbox_id: s.sandboxId, thread_id: s.threadId, user_id: s.uid }),
    });
    // A configuration whose URLs carry secrets: they must never reach a captured line.
    const config = loadConfig({
      DATABASE_URL: `postgres://app:${SECRET}@db.internal:5432/app`,
      SANDBOX_PROVISIONER_URL: `${fixture.provisioner.url}/?token=${SECRET}`,
    });
    const build = (name: string) => createTelemetry({ functionName: name, stage: 'test', logLevel: 'INFO' });
    const telemetry = {
      fenceCheck: build('fence-check'),
      release: build('release'),
      finalize: build('finalize'),
    };
    const infrastructure = testInfrastructure({
      config,
      db: fixture.t.db,
      queues: sqsFixture.queues,
      telemetry,
    });
    const wired = async <E, R>(root: Promise<ComposedFunction<E, R>>) => {
      const composed = await root;
      return withObservability(composed.handler, composed.telemetry);
    };
    const releaseFunction = await composeRelease(infrastructure);
    onTestFinished(() => releaseFunction.close());
    const fenceCheck = await wired(composeFenceCheck(infrastructure));
    const release = withObservability(releaseFunction.handler, releaseFunction.telemetry);
    const finalize = await wired(composeFinalize(infrastructure));

    await sqsFixture.queues.send(QueueName.RUN_FINISHED, { runId: s.rootRunId });
    const lines = await captureStdout(async () => {
      await fenceCheck(await takeOne(QueueName.RUN_FINISHED), localLambdaContext('fence-check', 60));
      await release(await takeOne(QueueName.RUNTIME_RELEASE), localLambdaContext('release', 60));
      await finalize(await takeOne(QueueName.RUNTIME_FINALIZE), localLambdaContext('finalize', 60));
      // A second invocation for another (unknown) run: its lines must not carry the first run's keys.
      await sqsFixture.queues.send(QueueName.RUN_FINISHED, { runId: 'ghost' });
      await fenceCheck(await takeOne(QueueName.RUN_FINISHED), localLambdaContext('fence-check', 60));
      // An error message that names the database URL is redacted on the way out.
      telemetry.finalize.logger.error('connection failed', {
        error: `could not reach ${config.databaseUrl}`,
      });
    });

    const metrics = emfMetrics(lines);
    const find = (name: string) => metrics.filter((metric) => metric.name === name);
    expect(metrics.every((metric) => metric.namespace === METRICS_NAMESPACE)).toBe(true);
    expect(find(MetricName.FENCE_CHECK_OUTCOME)[0]).toMatchObject({
      unit: 'Count',
      dimensions: {
        service: 'runtime-cleanup',
        stage: 'test',
        function: 'fence-check',
        outcome: 'release_needed',
      },
      value: 1,
    });
    expect(find(MetricName.RELEASE_SUCCEEDED)[0]).toMatchObject({
      unit: 'Count',
      dimensions: { outcome: 'deleted' },
    });
    expect(find(MetricName.RELEASE_DURATION)[0]?.unit).toBe('Milliseconds');
    expect(find(MetricName.RELEASE_LOCK_WAIT)[0]?.unit).toBe('Milliseconds');
    expect(find(MetricName.FINALIZE_OUTCOME)[0]).toMatchObject({ dimensions: { outcome: 'cleared' } });
    expect(find(MetricName.CLEANUP_LATENCY)[0]?.unit).toBe('Milliseconds');
    expect(find(MetricName.DEAD_LETTERED)[0]).toMatchObject({
      dimensions: { queue: 'run-finished', reason: 'RUN_NOT_FOUND' },
    });
    expect(find('ColdStart').length).toBeGreaterThanOrEqual(1);

    const logs = lines.filter((line) => !line._aws);
    const released = logs.find((line) => line.message === 'sandbox released')!;
    expect(released).toMatchObject({
      service: 'runtime-cleanup',
      stage: 'test',
      function: 'release',
      runId: s.rootRunId,
      uid: s.uid,
      runtimeScopeId: s.runtimeScopeId,
      generation: s.generation,
      phase: 'release',
      queue: 'runtime-release.fifo',
      receiveCount: 1,
    });
    expect(typeof released.messageId).toBe('string');
    expect(logs.find((line) => line.message === 'fence cleared')).toMatchObject({
      runId: s.rootRunId,
      phase: 'finalize',
    });
    const ghost = logs.find((line) => line.message === 'message dead-lettered')!;
    expect(ghost.runId).toBe('ghost');
    expect(ghost.uid).toBeUndefined();

    const everything = lines.map((line) => JSON.stringify(line)).join('\n');
    expect(everything).not.toContain(SECRET);
    expect(everything).toContain('app:***@db.internal');
  });
});
