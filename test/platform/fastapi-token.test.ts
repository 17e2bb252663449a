/**
 * A FastAPI provisioner that requires a bearer token, through the local stack: with the right
 * SANDBOX_PROVISIONER_TOKEN every cleanup completes; with a wrong one no fence clears, every
 * release fails with PROVISIONER_AUTH_FAILED (retried, then dead-lettered), and neither token
 * appears anywhere the functions write: their logs (captured at DEBUG), the dead letters.
 */
import type { Message } from '@aws-sdk/client-sqs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ErrorCode } from '../../functions/cleanup/errors.ts';
import { type AdmittedRun, PlatformSimulator } from '../../infra/local/platform.ts';
import { captureOutput } from '../support/capture.ts';
import { fenceOf } from '../support/factories.ts';
import { type FastApiProvisioner, startFastApiProvisioner } from '../support/fastapi-provisioner.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { fencesCleared, releaseDeadLetters, startTestStack, type TestStack } from '../support/stack.ts';

const RIGHT_TOKEN = 'right-token.Qm7v2Lp9';
const WRONG_TOKEN = 'wrong-token.Hx4k8Ty1';
const database = useDatabaseFixture();
let app: FastApiProvisioner;
const stacks: TestStack[] = [];

beforeAll(async () => {
  app = await startFastApiProvisioner({ token: RIGHT_TOKEN });
});
afterEach(async () => {
  await Promise.all(stacks.splice(0).map((stack) => stack.stop()));
  await app.clearRequests();
});
afterAll(async () => {
  await app?.stop();
});

async function stackWithToken(token: string): Promise<TestStack> {
  const stack = await startTestStack(database.t, {
    env: { SANDBOX_PROVISIONER_URL: app.url, SANDBOX_PROVISIONER_TOKEN: token },
    stack: {
      reclaimer: false,
      logLevel: 'DEBUG',
      queueOverrides: {
        visibilityTimeoutSeconds: { 'run-finished': 5, 'runtime-release.fifo': 10, 'runtime-finalize': 5 },
        maxReceiveCount: { 'runtime-release.fifo': 3 },
      },
    },
  });
  stacks.push(stack);
  return stack;
}

/** Finished root runs whose sandboxes the platform created with the right token. */
async function finishedRuns(stack: TestStack, count: number): Promise<AdmittedRun[]> {
  const platform = new PlatformSimulator(stack.db, stack.queues, app.url, { token: RIGHT_TOKEN });
  const runs: AdmittedRun[] = [];
  for (let i = 0; i < count; i += 1) runs.push((await platform.admitRootRun(await platform.createScope()))!);
  await app.clearRequests();
  for (const run of runs) await platform.finishRun(run.runId, 'completed');
  return runs;
}

describe('the right token', () => {
  it('is sent on every DELETE, and every fence clears', async () => {
    let runs: AdmittedRun[] = [];
    const output = await captureOutput(async () => {
      const stack = await stackWithToken(RIGHT_TOKEN);
      runs = await finishedRuns(stack, 2);
      await fencesCleared(
        database.t.db,
        runs.map((run) => run.runId),
      );
    });

    const seen = await app.requests();
    expect(seen.map(({ method, status, bearer }) => `${method} ${status} ${bearer}`)).toEqual([
      'DELETE 200 valid',
      'DELETE 200 valid',
    ]);
    expect(await app.sandboxIds()).toEqual([]);
    expect(output).toContain('sandbox released');
    expect(output).not.toContain(RIGHT_TOKEN);
  });
});

describe('a wrong token', () => {
  it('clears no fence, dead-letters every release with PROVISIONER_AUTH_FAILED, and is never written anywhere', async () => {
    let runs: AdmittedRun[] = [];
    let letters: Message[] = [];
    const output = await captureOutput(async () => {
      const stack = await stackWithToken(WRONG_TOKEN);
      runs = await finishedRuns(stack, 2);
      letters = await releaseDeadLetters(
        stack,
        runs.map((run) => run.runId),
        40_000,
      );
    });

    for (const letter of letters) {
      const attributes = letter.MessageAttributes!;
      expect(attributes.errorCode?.StringValue).toBe(ErrorCode.PROVISIONER_AUTH_FAILED);
      expect(attributes.reason?.StringValue).toMatch(
        /^retries exhausted; last error: provisioner answered 401 \(unauthorized\) to the token from SANDBOX_PROVISIONER_TOKEN/,
      );
      expect(JSON.stringify(letter)).not.toContain(WRONG_TOKEN);
    }
    for (const run of runs) expect(await fenceOf(database.t.db, run.runId)).toBe(true);
    const live = await app.sandboxIds();
    for (const run of runs) expect(live).toContain(run.sandboxId);
    // Retried (retryable, as a refused database password), each attempt refused before it acted.
    const deletes = (await app.requests()).filter(({ method }) => method === 'DELETE');
    expect(deletes.length).toBeGreaterThanOrEqual(2 * 3);
    expect(new Set(deletes.map(({ status, bearer }) => `${status} ${bearer}`))).toEqual(
      new Set(['401 invalid']),
    );
    // The logs were captured (the failures are in them), and hold neither token.
    expect(output).toContain(ErrorCode.PROVISIONER_AUTH_FAILED);
    expect(output).not.toContain(WRONG_TOKEN);
    expect(output).not.toContain(RIGHT_TOKEN);
  });
});
