import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { announceRunFinished } from '../../functions/platform/publish.ts';
import { QueueName } from '../../functions/platform/queues.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fenceOf } from '../support/factories.ts';
import { eventually, startTestStack, type TestStack } from '../support/stack.ts';

let t: TestDatabase;
let stack: TestStack;
beforeAll(async () => {
  t = await createTestDatabase();
  stack = await startTestStack(t);
});
afterAll(async () => {
  await stack?.stop();
  await t?.drop();
});

describe('run-finished → runtime-cleaned through the local stack', () => {
  it('deletes the sandbox process and directory, clears the fence and announces runtime-cleaned', async () => {
    const scope = await stack.platform.createScope();
    const run = (await stack.platform.admitRootRun(scope))!;
    const sandbox = stack.provisioner!.sandbox(run.sandboxId)!;
    expect(stack.provisioner!.isProcessAlive(sandbox.pid)).toBe(true);

    expect(await stack.platform.finishRun(run.runId, 'completed')).toBe(true);
    await eventually('fence cleared', async () => !(await fenceOf(t.db, run.runId)));

    expect(stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
    expect(stack.provisioner!.isProcessAlive(sandbox.pid)).toBe(false);
    const cleaned = await eventually('runtime-cleaned', async () => {
      const messages = await stack.drain(QueueName.RUNTIME_CLEANED);
      return messages.length ? messages : undefined;
    });
    expect(JSON.parse(cleaned[0]!.Body!)).toMatchObject({
      runId: run.runId,
      uid: scope.uid,
      runtimeScopeId: scope.runtimeScopeId,
      generation: run.generation,
    });
    for (const queue of [QueueName.RUN_FINISHED, QueueName.RUNTIME_RELEASE, QueueName.RUNTIME_FINALIZE]) {
      expect(await stack.deadLetters(queue)).toEqual([]);
    }
  });

  it('unblocks the scope so that a new run can be admitted, with a new generation', async () => {
    const scope = await stack.platform.createScope();
    const first = (await stack.platform.admitRootRun(scope))!;
    await stack.platform.finishRun(first.runId, 'failed', { announce: false });
    expect(await stack.platform.admitRootRun(scope)).toBeUndefined();
    await announceRunFinished(stack.queues, first.runId);
    await eventually('fence cleared', async () => !(await fenceOf(t.db, first.runId)));
    const second = await stack.platform.admitRootRun(scope);
    expect(second?.generation).toBe(first.generation + 1);
  });
});
