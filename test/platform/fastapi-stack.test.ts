/**
 * The whole cleanup through the local stack (real handlers, fauxqs, PostgreSQL) against a real
 * FastAPI provisioner that behaves as the platform's does: no generations, a `200` for every
 * DELETE, and FastAPI's own `404 {"detail":"Not Found"}` for a route it does not serve. The
 * platform side (admission, sandbox creation, finishing the run) is the local platform simulator,
 * pointed at the app's right URL; only the cleanup's SANDBOX_PROVISIONER_URL changes.
 */
import type { Message } from '@aws-sdk/client-sqs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { MetricName } from '../../functions/adapters/metric-names.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { ErrorCode } from '../../functions/cleanup/errors.ts';
import { type AdmittedRun, PlatformSimulator } from '../../infra/local/platform.ts';
import { captureStdout, emfMetrics } from '../support/capture.ts';
import { fenceOf } from '../support/factories.ts';
import { type FastApiProvisioner, startFastApiProvisioner } from '../support/fastapi-provisioner.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import {
  eventually,
  fencesCleared,
  releaseDeadLetters,
  startTestStack,
  type TestStack,
} from '../support/stack.ts';

const database = useDatabaseFixture();
let platformLike: FastApiProvisioner;
let gateway: FastApiProvisioner;
let reaping: FastApiProvisioner;
const stacks: TestStack[] = [];

beforeAll(async () => {
  [platformLike, gateway, reaping] = await Promise.all([
    startFastApiProvisioner(),
    startFastApiProvisioner({ prefix: '/provisioner' }),
    // Answers an unknown sandbox with FastAPI's HTTPException(404), and reaps idle sandboxes.
    startFastApiProvisioner({ absentStatus: 404, idleTimeoutSeconds: 0.5 }),
  ]);
});
afterEach(async () => {
  await Promise.all(stacks.splice(0).map((stack) => stack.stop()));
  process.env.POWERTOOLS_METRICS_DISABLED = 'true';
});
afterAll(async () => {
  await Promise.all([platformLike, gateway, reaping].map((app) => app?.stop()));
});

/** The cleanup's stack with SANDBOX_PROVISIONER_URL = `cleanupUrl`; no reclaimer (its listings would count). */
async function stackFor(cleanupUrl: string): Promise<TestStack> {
  const stack = await startTestStack(database.t, {
    env: { SANDBOX_PROVISIONER_URL: cleanupUrl },
    stack: { reclaimer: false },
  });
  stacks.push(stack);
  return stack;
}

/** Finished root runs, each with a sandbox the platform created at the app's right URL. */
async function finishedRuns(
  stack: TestStack,
  app: FastApiProvisioner,
  count: number,
): Promise<AdmittedRun[]> {
  const platform = new PlatformSimulator(stack.db, stack.queues, app.url);
  const runs: AdmittedRun[] = [];
  for (let i = 0; i < count; i += 1) {
    const run = await platform.admitRootRun(await platform.createScope());
    runs.push(run!);
  }
  return runs;
}

const runIds = (runs: AdmittedRun[]) => runs.map((run) => run.runId);

async function finish(stack: TestStack, runs: AdmittedRun[]): Promise<void> {
  const platform = new PlatformSimulator(stack.db, stack.queues, 'http://127.0.0.1:9');
  for (const run of runs) await platform.finishRun(run.runId, 'completed');
}

describe('a correct base URL', () => {
  it("clears every fence, the app's sandboxes are gone, and no request is added to the DELETEs", async () => {
    const stack = await stackFor(platformLike.url);
    const runs = await finishedRuns(stack, platformLike, 3);
    await platformLike.clearRequests();

    await finish(stack, runs);
    await fencesCleared(database.t.db, runIds(runs));

    // Steady state: one DELETE per cleanup, each answered 200, and no listing.
    const seen = await platformLike.requests();
    const live = await platformLike.sandboxIds();
    for (const run of runs) expect(live).not.toContain(run.sandboxId);
    expect(seen.map(({ method, status }) => `${method} ${status}`)).toEqual(Array(3).fill('DELETE 200'));
    expect(await stack.deadLetters(QueueName.RUNTIME_RELEASE)).toEqual([]);
  });

  it('clears the fences of sandboxes the idle reaper already deleted, each 404 checked by a listing taken after it', async () => {
    const stack = await stackFor(reaping.url);
    const runs = await finishedRuns(stack, reaping, 3);
    await eventually('the idle reaper to delete the sandboxes', async () => {
      const live = await reaping.sandboxIds();
      return runs.every((run) => !live.includes(run.sandboxId));
    });
    await reaping.clearRequests();

    await finish(stack, runs);
    await fencesCleared(database.t.db, runIds(runs));

    const seen = await reaping.requests();
    expect(seen.filter(({ method }) => method === 'DELETE').map(({ status }) => status)).toEqual([
      404, 404, 404,
    ]);
    // A 404 counts as gone only once a listing that started after it answered as the provisioner's
    // and does not name the sandbox: concurrent 404s may share one, no 404 goes unchecked.
    const listings = seen.filter(({ method }) => method === 'GET');
    expect(listings.length).toBeGreaterThanOrEqual(1);
    expect(listings.length).toBeLessThanOrEqual(3);
    expect(seen.at(-1)!.method).toBe('GET');
  });
});

describe('a base URL one path segment off', () => {
  it.each([
    ['with /v1 appended', () => platformLike, () => `${platformLike.url}/v1`],
    ['without the gateway prefix', () => gateway, () => gateway.origin],
  ])(
    '%s: no fence clears, every release dead-letters naming the URL, the metric counts each',
    async (_name, app, wrongUrl) => {
      process.env.POWERTOOLS_METRICS_DISABLED = 'false';
      let letters: Message[] = [];
      let runs: AdmittedRun[] = [];
      let stack: TestStack | undefined;
      const lines = await captureStdout(async () => {
        stack = await stackFor(wrongUrl());
        runs = await finishedRuns(stack, app(), 3);
        await app().clearRequests();
        await finish(stack, runs);
        letters = await releaseDeadLetters(stack, runIds(runs));
      });

      for (const letter of letters) {
        const attributes = letter.MessageAttributes!;
        expect(attributes.errorCode?.StringValue).toBe(ErrorCode.PROVISIONER_URL_UNVERIFIED);
        expect(attributes.reason?.StringValue).toContain(
          `${wrongUrl()} is not known to be the provisioner: GET ${wrongUrl()}/api/sandboxes answered 404 (application/json) "Not Found"`,
        );
      }
      for (const run of runs) expect(await fenceOf(database.t.db, run.runId)).toBe(true);
      const live = await app().sandboxIds();
      for (const run of runs) expect(live).toContain(run.sandboxId);
      // The scopes stay closed to new runs.
      const platform = new PlatformSimulator(stack!.db, stack!.queues, app().url);
      expect(await platform.admitRootRun(runs[0]!.scope)).toBeUndefined();
      // Dead-lettered at once: one DELETE per cleanup, none retried.
      const deletes = (await app().requests()).filter(({ method }) => method === 'DELETE');
      expect(deletes.map(({ status }) => status)).toEqual([404, 404, 404]);
      const refused = emfMetrics(lines).filter(({ name }) => name === MetricName.PROVISIONER_URL_UNVERIFIED);
      expect(refused).toHaveLength(3);
      expect(refused[0]).toMatchObject({ value: 1, dimensions: { function: 'release' } });
    },
  );
});
