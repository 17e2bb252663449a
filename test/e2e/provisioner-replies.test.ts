import { describe, expect, it } from 'vitest';
import { announceRunFinished } from '../../functions/adapters/publish.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import type { AdmittedRun } from '../../infra/local/platform.ts';
import type { Fault } from '../../infra/local/provisioner/server.ts';
import { fenceOf } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { eventually } from '../support/stack.ts';

/**
 * The provisioner's replies of contract v1.1 §3 end to end: real handlers behind the emulated
 * event source mapping, fauxqs visibility timeouts, PostgreSQL and the local provisioner. The
 * retry base is 1 s, so a retry that waits several seconds waits because it was asked to; the
 * release queue's visibility is 10 s, so a retry sooner than that was scheduled by the consumer.
 */
const RELEASE_VISIBILITY_SECONDS = 10;
const fixture = useStackFixture({
  env: { CLEANUP_RETRY_BASE_SECONDS: '1', CLEANUP_RETRY_MAX_SECONDS: '30' },
});

async function finishedRun(): Promise<AdmittedRun> {
  const scope = await fixture.stack.platform.createScope();
  const run = (await fixture.stack.platform.admitRootRun(scope))!;
  await fixture.stack.platform.finishRun(run.runId, 'completed', { announce: false });
  return run;
}

function deletesOf(sandboxId: string) {
  return fixture.stack
    .provisioner!.audit()
    .filter((entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId);
}

async function cleanedUpAfter(
  fault: Extract<Fault, { status: number }>,
): Promise<{ run: AdmittedRun; gapMs: number }> {
  const run = await finishedRun();
  fixture.stack.provisioner!.setFault(run.sandboxId, { ...fault, times: 1 });
  await announceRunFinished(fixture.stack.queues, run.runId);
  await eventually('the fence to clear', async () => !(await fenceOf(fixture.t.db, run.runId)), 30_000);
  const attempts = deletesOf(run.sandboxId);
  expect(attempts.map((entry) => entry.status)).toEqual([fault.status, 200]);
  return { run, gapMs: attempts[1]!.startedAt - attempts[0]!.endedAt! };
}

describe('a 429 with Retry-After', () => {
  it('is retried no earlier than asked (delta-seconds), then the cleanup completes', async () => {
    const { run, gapMs } = await cleanedUpAfter({
      status: 429,
      retryAfter: { seconds: 4, as: 'delta-seconds' },
    });
    expect(gapMs).toBeGreaterThanOrEqual(4_000);
    // Scheduled by the consumer, not left to the queue's visibility timeout.
    expect(gapMs).toBeLessThan(RELEASE_VISIBILITY_SECONDS * 1000);
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
  });

  it('is retried no earlier than asked (HTTP-date)', async () => {
    const { gapMs } = await cleanedUpAfter({ status: 429, retryAfter: { seconds: 3, as: 'http-date' } });
    // The date has whole seconds: it asks for at least 3 s from the moment it was written.
    expect(gapMs).toBeGreaterThanOrEqual(3_000);
    expect(gapMs).toBeLessThan(RELEASE_VISIBILITY_SECONDS * 1000);
  });
});

describe('a 410 (gone)', () => {
  it('counts as a confirmed delete: the fence clears at the first attempt', async () => {
    const run = await finishedRun();
    fixture.stack.provisioner!.setFault(run.sandboxId, { gone: true, times: 1 });
    await announceRunFinished(fixture.stack.queues, run.runId);
    await eventually('the fence to clear', async () => !(await fenceOf(fixture.t.db, run.runId)), 20_000);
    expect(deletesOf(run.sandboxId).map((entry) => entry.status)).toEqual([410]);
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
  });
});

describe('a 200 with an HTML page (a catch-all server at a wrong URL)', () => {
  it('is dead-lettered at once with its reason, the fence stays up and the sandbox lives', async () => {
    const run = await finishedRun();
    fixture.stack.provisioner!.setFault(run.sandboxId, {
      status: 200,
      contentType: 'text/html',
      body: '<!DOCTYPE html><html><head><title>It works!</title></head><body>It works!</body></html>',
    });
    await announceRunFinished(fixture.stack.queues, run.runId);

    const [letter] = await eventually(
      'the release in its DLQ',
      async () => {
        const letters = (await fixture.stack.deadLetters(QueueName.RUNTIME_RELEASE)).filter((message) =>
          message.Body?.includes(run.runId),
        );
        return letters.length ? letters : undefined;
      },
      20_000,
    );
    const attributes = letter!.MessageAttributes!;
    expect(attributes.errorCode?.StringValue).toBe('PROVISIONER_UNCONFIRMED');
    expect(attributes.reason?.StringValue).toMatch(
      /^provisioner answered 200 without confirming the delete \(Content-Type "text\/html" is not JSON\).*SANDBOX_PROVISIONER_URL/,
    );
    // Not retried: no retry can fix a wrong URL.
    expect(deletesOf(run.sandboxId)).toHaveLength(1);
    expect(await fenceOf(fixture.t.db, run.runId)).toBe(true);
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)?.alive).toBe(true);
    // The scope stays closed to new runs.
    expect(await fixture.stack.platform.admitRootRun(run.scope)).toBeUndefined();
    fixture.stack.provisioner!.clearFaults(run.sandboxId);
  });
});
