import type { SQSEvent } from 'aws-lambda';
import { describe, expect, it, onTestFinished } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import { QueueName, type Queues, type SendOptions } from '../../functions/adapters/queues.ts';
import { DEFERRALS_ATTRIBUTE, MAX_DEFERRALS } from '../../functions/cleanup/chain-limits.ts';
import { composeFenceCheck } from '../../functions/fence-check/handler.ts';
import { composeRelease } from '../../functions/release/handler.ts';
import { localLambdaContext } from '../../infra/local/event-source.ts';
import { fenceOf, finishedRootRun, insertOtherRun } from '../support/factories.ts';
import { useProvisionerFixture, useSqsFixture } from '../support/fixtures.ts';
import { testInfrastructure } from '../support/infrastructure.ts';
import { sqsRecord } from '../support/sqs-record.ts';

/**
 * How many times one event can invoke the same function through the chains the code builds.
 * Lambda's recursive-loop detection follows an event through SQS (the X-Ray lineage the SDK
 * forwards on every send) and, under its default `Terminate`, stops a function invoked by the
 * same event about 16 times and drops the message, without the reason our own dead letters
 * carry. Each hop below is one message the previous invocation sent, so the count of invocations
 * is exactly what the lineage counts. serverless.yml sets RecursiveLoop from what this measures.
 */
const fixture = useProvisionerFixture({ tempPrefix: 'deferral-chain-', graceMs: 200 });
const sqsFixture = useSqsFixture();

/** "About 16" in AWS's documentation of recursive loop detection. */
const LAMBDA_RECURSION_LIMIT = 16;

interface Sent {
  queue: string;
  body: Record<string, unknown>;
  options: SendOptions;
}

/** The real queues, with every send also written down in order. */
function recording(inner: Queues, sent: Sent[]): Queues {
  return {
    ...inner,
    async send(queue, body, options = {}) {
      const id = await inner.send(queue, body, options);
      sent.push({
        queue,
        body: (typeof body === 'string' ? JSON.parse(body) : body) as Sent['body'],
        options,
      });
      return id;
    },
  };
}

async function functions() {
  const sent: Sent[] = [];
  const config = loadConfig({
    CLEANUP_RETRY_BASE_SECONDS: '10',
    CLEANUP_RETRY_MAX_SECONDS: '900',
    SANDBOX_PROVISIONER_URL: fixture.provisioner.url,
  });
  const infrastructure = testInfrastructure({
    config,
    db: fixture.t.db,
    queues: recording(sqsFixture.queues, sent),
    telemetry: createTelemetry({ functionName: 'deferral-chain-test', logLevel: 'SILENT' }),
  });
  const fenceCheck = await composeFenceCheck(infrastructure);
  const release = await composeRelease(infrastructure);
  onTestFinished(() => release.close());
  const invoke = async (
    handler: typeof fenceCheck.handler,
    body: unknown,
    group?: string,
    messageAttributes?: Record<string, string>,
  ) => {
    const before = sent.length;
    const event: SQSEvent = {
      Records: [
        sqsRecord(JSON.stringify(body), {
          ...(group ? { attributes: { MessageGroupId: group } } : {}),
          ...(messageAttributes ? { messageAttributes } : {}),
        }),
      ],
    };
    const response = await handler(event, localLambdaContext('deferral-chain-test', 30));
    expect(response.batchItemFailures).toEqual([]);
    return sent.slice(before);
  };
  return {
    sent,
    fenceCheck: (body: unknown, messageAttributes?: Record<string, string>) =>
      invoke(fenceCheck.handler, body, undefined, messageAttributes),
    release: (body: Record<string, unknown>) =>
      invoke(release.handler, body, `${String(body.uid)}:${String(body.runtimeScopeId)}`),
  };
}

/**
 * Feeds fence-check the message it sent itself, hop by hop, while it keeps deferring. Returns the
 * invocations made and what the last one sent (nothing, once the chain ends).
 */
async function followDeferrals(
  run: Awaited<ReturnType<typeof functions>>,
  first: Record<string, unknown>,
  options: { stopAfter?: number } = {},
) {
  let body = first;
  let attributes: Record<string, string> | undefined;
  const delays: number[] = [];
  let invocations = 0;
  for (;;) {
    const out = await run.fenceCheck(body, attributes);
    invocations += 1;
    const again = out.filter((message) => message.queue === QueueName.RUN_FINISHED);
    if (!again.length || invocations === options.stopAfter) return { invocations, delays, last: out };
    expect(again).toHaveLength(1);
    delays.push(again[0]!.options.delaySeconds ?? 0);
    // As SQS delivers it: the body and the message attributes the send set.
    body = again[0]!.body;
    attributes = again[0]!.options.attributes;
  }
}

describe('deferral chains', () => {
  it(`a fence check deferred while its scope stays busy re-sends itself ${MAX_DEFERRALS} times with a growing delay, then leaves the fence to the sweeper`, async () => {
    const s = await finishedRootRun(fixture.t.db);
    await insertOtherRun(fixture.t.db, s, { status: 'running' });
    const run = await functions();

    const chain = await followDeferrals(run, { runId: s.rootRunId });

    expect(chain.invocations).toBe(MAX_DEFERRALS + 1);
    expect(chain.delays).toHaveLength(MAX_DEFERRALS);
    // Never a hot loop: every hop waits at least half the base delay (the backoff's jitter floor),
    // and no more than SQS's 900 s.
    for (const delay of chain.delays) {
      expect(delay).toBeGreaterThanOrEqual(5);
      expect(delay).toBeLessThanOrEqual(900);
    }
    expect(chain.last).toEqual([]);
    // The chain ended; the fence did not: the sweeper announces it again later.
    expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
  });

  it.each([
    ['the last count', MAX_DEFERRALS],
    ['a count past the bound', 1_000_000_000],
    ['a negative count', -5],
    ['a count that is not a number', 'many'],
  ])(
    'a run-finished from outside with %s in its body does not move the chain: it runs its whole length',
    async (_name, forged) => {
      const s = await finishedRootRun(fixture.t.db);
      await insertOtherRun(fixture.t.db, s, { status: 'running' });
      const run = await functions();

      const chain = await followDeferrals(run, { runId: s.rootRunId, deferrals: forged });

      expect(chain.invocations).toBe(MAX_DEFERRALS + 1);
      expect(await fenceOf(fixture.t.db, s.rootRunId)).toBe(true);
    },
  );

  it('a forged attribute that does not repeat the body, or is past the bound, is not trusted either', async () => {
    const s = await finishedRootRun(fixture.t.db);
    await insertOtherRun(fixture.t.db, s, { status: 'running' });
    const run = await functions();
    for (const [body, attribute] of [
      [MAX_DEFERRALS, String(MAX_DEFERRALS - 1)],
      [MAX_DEFERRALS + 5, String(MAX_DEFERRALS + 5)],
      [0, '0'],
    ] as const) {
      const out = await run.fenceCheck(
        { runId: s.rootRunId, deferrals: body },
        { [DEFERRALS_ATTRIBUTE]: attribute },
      );
      const again = out.filter((message) => message.queue === QueueName.RUN_FINISHED);
      expect(again, `${body}/${attribute}`).toHaveLength(1);
      expect(again[0]!.body.deferrals).toBe(1);
    }
    // The cleanup's own re-send, body and attribute agreeing, is followed: the chain moves on.
    const own = await run.fenceCheck({ runId: s.rootRunId, deferrals: 3 }, { [DEFERRALS_ATTRIBUTE]: '3' });
    expect(own.find((message) => message.queue === QueueName.RUN_FINISHED)!.body.deferrals).toBe(4);
  });

  it(`one event can invoke fence-check more than Lambda's ~${LAMBDA_RECURSION_LIMIT} times on a healthy path, so its RecursiveLoop must be Allow`, async () => {
    const s = await finishedRootRun(fixture.t.db);
    const child = await insertOtherRun(fixture.t.db, s, { status: 'running' });
    const run = await functions();

    // The scope is busy for three re-checks, then quiet: phase 1 asks for a release.
    const first = await followDeferrals(run, { runId: s.rootRunId }, { stopAfter: 4 });
    await fixture.t.db.query(`UPDATE agent_runs SET status = 'completed' WHERE id = $1::text`, [child]);
    const releaseRequest = (await run.fenceCheck({ ...first.last[0]!.body })).find(
      (message) => message.queue === QueueName.RUNTIME_RELEASE,
    );
    expect(releaseRequest).toBeDefined();
    // A run becomes active in the scope before the release deletes: the guard sends the cleanup
    // back to phase 1 (a new run-finished message, same lineage), which defers again.
    await insertOtherRun(fixture.t.db, s, { status: 'running' });
    const restart = (await run.release(releaseRequest!.body)).find(
      (message) => message.queue === QueueName.RUN_FINISHED,
    );
    expect(restart?.body).toMatchObject({ runId: s.rootRunId, reason: 'scope_active_at_release' });
    const second = await followDeferrals(run, restart!.body);

    const fenceCheckInvocations = first.invocations + 1 + second.invocations;
    expect(second.invocations).toBe(MAX_DEFERRALS + 1);
    expect(fenceCheckInvocations).toBeGreaterThan(LAMBDA_RECURSION_LIMIT);
  });
});
