import { describe, expect, it } from 'vitest';
import { announceRunFinished } from '../../functions/adapters/publish.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { fenceOf } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { eventually } from '../support/stack.ts';

const fixture = useStackFixture();

describe('run-finished → runtime-cleaned through the local stack', () => {
  it('deletes the sandbox process and directory, clears the fence and announces runtime-cleaned', async () => {
    const scope = await fixture.stack.platform.createScope();
    const run = (await fixture.stack.platform.admitRootRun(scope))!;
    const sandbox = fixture.stack.provisioner!.sandbox(run.sandboxId)!;
    expect(fixture.stack.provisioner!.isProcessAlive(sandbox.pid)).toBe(true);

    expect(await fixture.stack.platform.finishRun(run.runId, 'completed')).toBe(true);
    await eventually('fence cleared', async () => !(await fenceOf(fixture.t.db, run.runId)));

    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
    expect(fixture.stack.provisioner!.isProcessAlive(sandbox.pid)).toBe(false);
    const cleaned = await eventually('runtime-cleaned', async () => {
      const messages = await fixture.stack.drain(QueueName.RUNTIME_CLEANED);
      return messages.length ? messages : undefined;
    });
    expect(JSON.parse(cleaned[0]!.Body!)).toMatchObject({
      runId: run.runId,
      uid: scope.uid,
      runtimeScopeId: scope.runtimeScopeId,
      generation: run.generation,
    });
    for (const queue of [QueueName.RUN_FINISHED, QueueName.RUNTIME_RELEASE, QueueName.RUNTIME_FINALIZE]) {
      expect(await fixture.stack.deadLetters(queue)).toEqual([]);
    }
  });

  it('unblocks the scope so that a new run can be admitted, with a new generation', async () => {
    const scope = await fixture.stack.platform.createScope();
    const first = (await fixture.stack.platform.admitRootRun(scope))!;
    await fixture.stack.platform.finishRun(first.runId, 'failed', { announce: false });
    expect(await fixture.stack.platform.admitRootRun(scope)).toBeUndefined();
    await announceRunFinished(fixture.stack.queues, first.runId);
    await eventually('fence cleared', async () => !(await fenceOf(fixture.t.db, first.runId)));
    const second = await fixture.stack.platform.admitRootRun(scope);
    expect(second?.generation).toBe(first.generation + 1);
  });
});
