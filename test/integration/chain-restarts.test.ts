import type { SQSEvent } from 'aws-lambda';
import { describe, expect, it, onTestFinished } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import {
  deadLetterQueueName,
  QueueName,
  type Queues,
  type SendOptions,
} from '../../functions/adapters/queues.ts';
import { MAX_RESTARTS, RESTARTS_ATTRIBUTE } from '../../functions/cleanup/chain-limits.ts';
import { ErrorCode } from '../../functions/cleanup/errors.ts';
import { composeFenceCheck } from '../../functions/fence-check/handler.ts';
import { composeFinalize } from '../../functions/finalize/handler.ts';
import { composeRelease } from '../../functions/release/handler.ts';
import { localLambdaContext } from '../../infra/local/event-source.ts';
import {
  fenceOf,
  finishedRootRun,
  insertOtherRun,
  type Scenario,
  upsertSandbox,
} from '../support/factories.ts';
import { useProvisionerFixture, useSqsFixture } from '../support/fixtures.ts';
import { testInfrastructure } from '../support/infrastructure.ts';
import { sqsRecord } from '../support/sqs-record.ts';

/**
 * Restarts of the chain at phase 1 are counted, delayed and bounded (chain-limits.ts, MAX_RESTARTS).
 * They used to be sent at once and without a count, so a disagreement that persists was a hot
 * loop with one provisioner DELETE per lap and no end (in AWS, only Lambda's recursive-loop
 * detection stopped it, dropping the message without a dead letter).
 *
 * The persistent cause modelled: a platform reconciler that re-creates the sandbox of a scope
 * whose fence is up right after each delete (a new generation recorded before finalize runs), so
 * finalize finds the generation changed on every lap. Real handlers, real PostgreSQL, the real
 * local provisioner and the real SQS emulator; each lap's messages are handed on as SQS delivers
 * them (body and message attributes).
 */
const fixture = useProvisionerFixture({ tempPrefix: 'chain-restarts-', graceMs: 200 });
const sqsFixture = useSqsFixture();

interface Sent {
  queue: string;
  body: Record<string, unknown>;
  options: SendOptions;
}

async function compose() {
  const sent: Sent[] = [];
  const queues: Queues = {
    ...sqsFixture.queues,
    async send(queue, body, options = {}) {
      const id = await sqsFixture.queues.send(queue, body, options);
      sent.push({
        queue,
        body: (typeof body === 'string' ? JSON.parse(body) : body) as Sent['body'],
        options,
      });
      return id;
    },
  };
  const config = loadConfig({
    CLEANUP_RETRY_BASE_SECONDS: '10',
    CLEANUP_RETRY_MAX_SECONDS: '900',
    SANDBOX_PROVISIONER_URL: fixture.provisioner.url,
  });
  const telemetry = createTelemetry({ functionName: 'chain-restarts', logLevel: 'SILENT' });
  const infra = testInfrastructure({ config, db: fixture.t.db, queues, telemetry });
  const fenceCheck = await composeFenceCheck(infra);
  const release = await composeRelease(infra);
  onTestFinished(() => release.close());
  const finalize = await composeFinalize(infra);

  /** Delivers one message to a handler as SQS would and returns what the handler sent. */
  const deliver = async (handler: typeof fenceCheck.handler, message: Sent, s: Scenario) => {
    const before = sent.length;
    const record = sqsRecord(JSON.stringify(message.body), {
      ...(message.queue === QueueName.RUNTIME_RELEASE
        ? { attributes: { MessageGroupId: `${s.uid}:${s.runtimeScopeId}` } }
        : {}),
      ...(message.options.attributes ? { messageAttributes: message.options.attributes } : {}),
    });
    const response = await handler(
      { Records: [record] } as SQSEvent,
      localLambdaContext('chain-restarts', 30),
    );
    expect(response.batchItemFailures).toEqual([]);
    return sent.slice(before);
  };
  return { fenceCheck, release, finalize, deliver };
}

describe('restarts of the chain at phase 1', () => {
  it('a persistent identity_changed ends in ONE dead letter (IDENTITY_UNSTABLE) after bounded, delayed laps', async () => {
    const s = await finishedRootRun(fixture.t.db, { generation: 3 });
    const { fenceCheck, release, finalize, deliver } = await compose();

    let message: Sent | undefined = {
      queue: QueueName.RUN_FINISHED,
      body: { runId: s.rootRunId },
      options: {},
    };
    let laps = 0;
    let generation = 3;
    const restarts: Sent[] = [];
    const deadLetters: Sent[] = [];
    while (message && laps <= 3 * MAX_RESTARTS) {
      laps += 1;
      const toRelease = (await deliver(fenceCheck.handler, message, s)).find(
        (m) => m.queue === QueueName.RUNTIME_RELEASE,
      );
      if (!toRelease) throw new Error(`lap ${laps}: phase 1 asked for no release`);
      const toFinalize = (await deliver(release.handler, toRelease, s)).find(
        (m) => m.queue === QueueName.RUNTIME_FINALIZE,
      );
      if (!toFinalize) throw new Error(`lap ${laps}: the release sent no finalize`);
      // The platform's reconciler re-creates the scope's sandbox right after the delete.
      generation += 1;
      await upsertSandbox(fixture.t.db, { ...s, sandboxId: s.sandboxId, generation });
      const afterFinalize = await deliver(finalize.handler, toFinalize, s);
      deadLetters.push(
        ...afterFinalize.filter((m) => m.queue === deadLetterQueueName(QueueName.RUNTIME_FINALIZE)),
      );
      message = afterFinalize.find((m) => m.queue === QueueName.RUN_FINISHED);
      if (message) restarts.push(message);
    }

    // MAX_RESTARTS restarts, then the next disagreement is dead-lettered: MAX_RESTARTS + 1 laps.
    expect(laps).toBe(MAX_RESTARTS + 1);
    expect(restarts.map((m) => m.body.restarts)).toEqual(
      Array.from({ length: MAX_RESTARTS }, (_, i) => i + 1),
    );
    for (const restart of restarts) {
      expect(restart.options.delaySeconds).toBeGreaterThan(0);
      expect(restart.options.attributes?.[RESTARTS_ATTRIBUTE]).toBe(String(restart.body.restarts));
    }
    // Backoff: the last restart waits longer than the first could.
    expect(restarts.at(-1)!.options.delaySeconds).toBeGreaterThan(10);
    expect(deadLetters).toHaveLength(1);
    expect(deadLetters[0]!.options.attributes).toEqual(
      expect.objectContaining({ errorCode: ErrorCode.IDENTITY_UNSTABLE }),
    );
    expect(deadLetters[0]!.options.attributes?.reason).toMatch(/identity changed again \(generation\)/);
    // The fence is kept: the sweeper announces it again later, an operator can look.
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
  }, 120_000);

  it('a restart count forged on the public run-finished queue (no attribute) is ignored', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const { fenceCheck, deliver } = await compose();
    const forged: Sent = {
      queue: QueueName.RUN_FINISHED,
      body: { runId: s.rootRunId, restarts: MAX_RESTARTS },
      options: {},
    };
    const toRelease = (await deliver(fenceCheck.handler, forged, s)).find(
      (m) => m.queue === QueueName.RUNTIME_RELEASE,
    );
    expect(toRelease?.body.restarts).toBeUndefined();
  });

  it('a release-side restart (scope active at the guard) is counted, delayed, and dead-lettered past the bound', async () => {
    const s = await finishedRootRun(fixture.t.db);
    const { fenceCheck, release, deliver } = await compose();
    const toRelease = (
      await deliver(
        fenceCheck.handler,
        { queue: QueueName.RUN_FINISHED, body: { runId: s.rootRunId }, options: {} },
        s,
      )
    ).find((m) => m.queue === QueueName.RUNTIME_RELEASE)!;
    // A new run is admitted to the scope between phase 1 and the release guard.
    await insertOtherRun(fixture.t.db, s, { status: 'running' });

    const first = await deliver(release.handler, toRelease, s);
    expect(first).toEqual([
      expect.objectContaining({
        queue: QueueName.RUN_FINISHED,
        body: expect.objectContaining({ restarts: 1, reason: 'scope_active_at_release' }),
        options: expect.objectContaining({ delaySeconds: expect.any(Number) }),
      }),
    ]);

    const exhausted = { ...toRelease, body: { ...toRelease.body, restarts: MAX_RESTARTS } };
    const last = await deliver(release.handler, exhausted, s);
    expect(last).toHaveLength(1);
    expect(last[0]!.queue).toBe(deadLetterQueueName(QueueName.RUNTIME_RELEASE));
    expect(last[0]!.options.attributes).toEqual(
      expect.objectContaining({ errorCode: ErrorCode.IDENTITY_UNSTABLE }),
    );
  });
});
