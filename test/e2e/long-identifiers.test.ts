/**
 * The database's columns are unbounded text; a cleanup message carries each field up to a limit
 * (MESSAGE_FIELD_LIMITS). A value within it is cleaned end to end like any other (the old limits,
 * 256 characters for a scope id and 512 for a sandbox id, refused a 600-character scope: its fence
 * never cleared and its messages dead-lettered forever). A value beyond it is refused where it is
 * read from the database, once, with a dead letter naming the field; nothing is sent that the
 * next consumer would refuse. Through the local stack: real handlers, fauxqs, PostgreSQL and the
 * local provisioner.
 */
import { describe, expect, it } from 'vitest';
import { MESSAGE_FIELD_LIMITS } from '../../functions/adapters/messages.ts';
import { announceRunFinished } from '../../functions/adapters/publish.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import type { ScopeRef } from '../../infra/local/platform.ts';
import { fenceOf } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { eventually } from '../support/stack.ts';

const fixture = useStackFixture();

async function scopeWithId(length: number): Promise<ScopeRef> {
  const scope = await fixture.stack.platform.createScope();
  const prefix = `${scope.runtimeScopeId}-`;
  return { ...scope, runtimeScopeId: `${prefix}${'s'.repeat(length - prefix.length)}` };
}

describe('identifiers longer than the old message limits', () => {
  it('cleans a run whose scope id has 600 characters: fence-check → release → finalize', async () => {
    const scope = await scopeWithId(600);
    expect(scope.runtimeScopeId).toHaveLength(600);
    const run = (await fixture.stack.platform.admitRootRun(scope))!;
    expect(run.sandboxId.length).toBeGreaterThan(600);
    const sandbox = fixture.stack.provisioner!.sandbox(run.sandboxId)!;

    expect(await fixture.stack.platform.finishRun(run.runId, 'completed')).toBe(true);
    await eventually('fence cleared', async () => !(await fenceOf(fixture.t.db, run.runId)));

    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
    expect(fixture.stack.provisioner!.isProcessAlive(sandbox.pid)).toBe(false);
    const cleaned = await eventually('runtime-cleaned', async () => {
      const mine = (await fixture.stack.drain(QueueName.RUNTIME_CLEANED)).filter((m) =>
        m.Body?.includes(run.runId),
      );
      return mine.length ? mine : undefined;
    });
    expect(JSON.parse(cleaned[0]!.Body!)).toMatchObject({
      runId: run.runId,
      runtimeScopeId: scope.runtimeScopeId,
    });
    for (const queue of [QueueName.RUN_FINISHED, QueueName.RUNTIME_RELEASE, QueueName.RUNTIME_FINALIZE]) {
      expect((await fixture.stack.deadLetters(queue)).filter((m) => m.Body?.includes(run.runId))).toEqual([]);
    }
  });

  it('refuses a scope id beyond the limit where it is read: one dead letter naming the field, the fence kept', async () => {
    const length = MESSAGE_FIELD_LIMITS.id + 904;
    const scope = await scopeWithId(length);
    const run = (await fixture.stack.platform.admitRootRun(scope))!;
    await fixture.stack.platform.finishRun(run.runId, 'completed', { announce: false });
    await announceRunFinished(fixture.stack.queues, run.runId);

    const letters = await eventually('the run-finished dead letter', async () => {
      const mine = (await fixture.stack.deadLetters(QueueName.RUN_FINISHED)).filter((m) =>
        m.Body?.includes(run.runId),
      );
      return mine.length ? mine : undefined;
    });
    const attributes = letters[0]!.MessageAttributes!;
    expect(attributes.errorCode?.StringValue).toBe('MESSAGE_INVALID');
    expect(attributes.reason?.StringValue).toBe(
      `cannot send to runtime-release.fifo: runtimeScopeId is ${length} characters, more than the ${MESSAGE_FIELD_LIMITS.id} a cleanup message carries`,
    );
    // Nothing was sent for the consumer to refuse, nothing deleted, and the fence is still up.
    expect(
      (await fixture.stack.deadLetters(QueueName.RUNTIME_RELEASE)).filter((m) => m.Body?.includes(run.runId)),
    ).toEqual([]);
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeDefined();
    expect(await fenceOf(fixture.t.db, run.runId)).toBe(true);
  });
});
