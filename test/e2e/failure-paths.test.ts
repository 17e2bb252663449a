/**
 * Failure paths end to end: real handlers behind the emulated event source mapping, fauxqs,
 * PostgreSQL and the local provisioner with injected faults. Timeouts and backoff are shortened
 * (1 s delete timeout, 1–2 s retry delays); their shape is the deployed one.
 */
import { describe, expect, it } from 'vitest';
import { announceRunFinished, publishFinalize } from '../../functions/adapters/publish.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { FenceCheckOutcome } from '../../functions/cleanup/types.ts';
import type { AdmittedRun } from '../../infra/local/platform.ts';
import { fenceOf } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { eventually } from '../support/stack.ts';

const fixture = useStackFixture({
  env: {
    SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '1',
    SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '1',
    SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '3',
    FENCE_SWEEP_AFTER_SECONDS: '1',
  },
  stack: {
    queueOverrides: {
      visibilityTimeoutSeconds: { 'run-finished': 5, 'runtime-release.fifo': 10, 'runtime-finalize': 5 },
      maxReceiveCount: { 'runtime-release.fifo': 3 },
    },
  },
});

async function finishedRun(options: { announce?: boolean } = {}): Promise<AdmittedRun> {
  const scope = await fixture.stack.platform.createScope();
  const run = (await fixture.stack.platform.admitRootRun(scope))!;
  await fixture.stack.platform.finishRun(run.runId, 'completed', { announce: options.announce ?? false });
  return run;
}

function deletesOf(sandboxId: string) {
  return fixture.stack
    .provisioner!.audit()
    .filter((entry) => entry.method === 'DELETE' && entry.sandboxId === sandboxId);
}

async function deadLettersOf(queue: string, runId: string) {
  return (await fixture.stack.deadLetters(queue)).filter((message) => message.Body?.includes(runId));
}

describe('a provisioner that fails, then hangs, then recovers (within the 3 receives allowed here)', () => {
  it('keeps the fence up throughout, backs off between attempts, and converges with no dead letter', async () => {
    const run = await finishedRun();
    fixture.stack.provisioner!.setFault(run.sandboxId, { status: 503, times: 1 });
    fixture.stack.provisioner!.setFault(run.sandboxId, { hang: true, times: 1 });

    const fenceSamples: boolean[] = [];
    await announceRunFinished(fixture.stack.queues, run.runId);
    await eventually(
      'the fence to clear',
      async () => {
        const fence = await fenceOf(fixture.t.db, run.runId);
        fenceSamples.push(fence);
        return !fence;
      },
      30_000,
    );

    const attempts = deletesOf(run.sandboxId);
    expect(attempts.map((entry) => (entry.outcome === 'answered' ? entry.status : entry.outcome))).toEqual([
      503,
      'aborted',
      200,
    ]);
    // The fence was up at every sample until the successful delete; it went down exactly once.
    expect(fenceSamples.slice(0, -1).every(Boolean)).toBe(true);
    // Backoff: each retry waited at least half the 1 s base delay (equal jitter), never a hot loop.
    for (let i = 1; i < attempts.length; i += 1) {
      const gap = attempts[i]!.startedAt - (attempts[i - 1]!.endedAt ?? attempts[i - 1]!.startedAt);
      expect(gap).toBeGreaterThanOrEqual(400);
    }
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
    expect(await deadLettersOf(QueueName.RUNTIME_RELEASE, run.runId)).toEqual([]);
  });
});

describe('a provisioner that keeps failing', () => {
  it('dead-letters the release after the configured receives with its reason, keeps the fence, and the sweeper announces it again', async () => {
    const run = await finishedRun();
    fixture.stack.provisioner!.setFault(run.sandboxId, { status: 500 });
    await announceRunFinished(fixture.stack.queues, run.runId);

    const [deadLetter] = await eventually(
      'the release in its DLQ',
      async () => {
        const letters = await deadLettersOf(QueueName.RUNTIME_RELEASE, run.runId);
        return letters.length ? letters : undefined;
      },
      30_000,
    );
    expect(deletesOf(run.sandboxId)).toHaveLength(3);
    expect(deadLetter!.MessageAttributes?.errorCode?.StringValue).toBe('PROVISIONER_UNAVAILABLE');
    expect(deadLetter!.MessageAttributes?.reason?.StringValue).toMatch(/retries exhausted.*500/);
    expect(await fenceOf(fixture.t.db, run.runId)).toBe(true);
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeDefined();

    // The provisioner recovers; the sweeper re-announces the stale fence and the cleanup completes.
    fixture.stack.provisioner!.clearFaults(run.sandboxId);
    const sweep = await eventually('the sweeper to re-announce the fence', async () => {
      const result = await fixture.stack.runSweeper();
      return result.announced.includes(run.runId) ? result : undefined;
    });
    expect(sweep.pendingFences).toBeGreaterThanOrEqual(1);
    await eventually(
      'the fence to clear after the sweep',
      async () => !(await fenceOf(fixture.t.db, run.runId)),
      20_000,
    );
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
  });
});

describe('duplicates', () => {
  /**
   * Five announcements start five chains: five release commands in the scope's FIFO group, each
   * DELETE naming the same generation, so the first removes the sandbox and the rest are answered
   * 404. A deletion is counted where it happens, at the provisioner (`deletedGeneration`), not by
   * the 200 a client heard: the DELETE that does the work can be one its release stopped waiting
   * for (the 1 s delete timeout of this file; a loaded machine once got there), which the
   * provisioner carries out all the same, as a real one would. That release then retries, hears
   * 404, and the fence clears once the delete-in-flight window of the unheard DELETE has ended.
   */
  async function fiveAnnouncementsAndARedeliveredFinalize(run: AdmittedRun): Promise<void> {
    const check = await fenceCheck(fixture.t.db, run.runId);
    expect(check.outcome).toBe(FenceCheckOutcome.RELEASE_NEEDED);
    const identity = check.outcome === FenceCheckOutcome.RELEASE_NEEDED ? check.identity : undefined;

    await Promise.all(Array.from({ length: 5 }, () => announceRunFinished(fixture.stack.queues, run.runId)));
    // 30 s: an unheard DELETE keeps the scope's delete-in-flight record up for 11 s here.
    await eventually('the fence to clear', async () => !(await fenceOf(fixture.t.db, run.runId)), 30_000);
    // Looked at as soon as the fence reads clear: a chain that cleared it through a path that
    // never deletes (nothing to delete, already released, a restart) would leave the sandbox live.
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
    await publishFinalize(fixture.stack.queues, identity!, 'deleted');

    const cleaned = await eventually('runtime-cleaned for the redelivered finalize', async () => {
      const messages = (await fixture.stack.drain(QueueName.RUNTIME_CLEANED)).filter((m) =>
        m.Body?.includes(run.runId),
      );
      return messages.length ? messages : undefined;
    });
    expect(cleaned.length).toBeGreaterThanOrEqual(1);
    // Exactly one DELETE removed a sandbox, and it was the captured generation; every other one
    // found nothing to remove.
    const deletions = deletesOf(run.sandboxId).filter((entry) => entry.deletedGeneration !== undefined);
    expect(deletions.map((entry) => entry.deletedGeneration)).toEqual([run.generation]);
    const { rows } = await fixture.t.db.query<{ released: boolean }>(
      'SELECT released_at IS NOT NULL AS released FROM sandbox_runtimes WHERE uid = $1::text',
      [run.scope.uid],
    );
    expect(rows[0]!.released).toBe(true);
    for (const queue of [QueueName.RUN_FINISHED, QueueName.RUNTIME_RELEASE, QueueName.RUNTIME_FINALIZE]) {
      expect(await deadLettersOf(queue, run.runId)).toEqual([]);
    }
    expect(fixture.stack.errors).toEqual([]);
  }

  it('five run-finished announcements and a redelivered finalize clear the fence once and delete the sandbox once, without error or dead letter', async () => {
    await fiveAnnouncementsAndARedeliveredFinalize(await finishedRun());
  });

  it('the same when the release gives up on the DELETE that removes the sandbox (no 200 is ever heard)', async () => {
    const run = await finishedRun();
    // Carried out 1.5 s after it arrives, past the release's 1 s delete timeout: what a loaded
    // machine did by chance, made certain.
    fixture.stack.provisioner!.setFault(run.sandboxId, {
      latencyMs: 1500,
      completeIfAbandoned: true,
      times: 1,
    });
    await fiveAnnouncementsAndARedeliveredFinalize(run);
    const deletes = deletesOf(run.sandboxId);
    expect(deletes.find((entry) => entry.deletedGeneration !== undefined)?.outcome).toBe('aborted');
    expect(deletes.filter((entry) => entry.status === 200)).toEqual([]);
  });
});

describe('bad messages', () => {
  it('dead-letters a malformed body and an unknown run with their reasons', async () => {
    await fixture.stack.queues.send(QueueName.RUN_FINISHED, 'not json at all');
    await fixture.stack.queues.send(QueueName.RUN_FINISHED, { runId: 'run-that-does-not-exist' });
    const letters = await eventually('both in the run-finished DLQ', async () => {
      const all = await fixture.stack.deadLetters(QueueName.RUN_FINISHED);
      const malformed = all.find((m) => m.Body === 'not json at all');
      const unknown = all.find((m) => m.Body?.includes('run-that-does-not-exist'));
      return malformed && unknown ? { malformed, unknown } : undefined;
    });
    expect(letters.malformed.MessageAttributes?.errorCode?.StringValue).toBe('MESSAGE_INVALID');
    expect(letters.malformed.MessageAttributes?.reason?.StringValue).toMatch(/not valid JSON/);
    expect(letters.unknown.MessageAttributes?.errorCode?.StringValue).toBe('RUN_NOT_FOUND');
    expect(letters.unknown.MessageAttributes?.reason?.StringValue).toMatch(/does not exist/);
  });
});

describe('the sweeper alone', () => {
  it('cleans a fence whose run-finished was never sent', async () => {
    const run = await finishedRun({ announce: false });
    await eventually('the sweeper to announce the fence', async () => {
      const result = await fixture.stack.runSweeper();
      return result.announced.includes(run.runId);
    });
    await eventually('the fence to clear', async () => !(await fenceOf(fixture.t.db, run.runId)));
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();
  });
});

describe('deferral', () => {
  it('re-checks a scope that is still busy with growing delays, never dead-letters it, and cleans up once the child run ends', async () => {
    const scope = await fixture.stack.platform.createScope();
    const root = (await fixture.stack.platform.admitRootRun(scope))!;
    const child = await fixture.stack.platform.startSubagent(root);
    await fixture.stack.platform.finishRun(root.runId, 'completed');

    // Watch the re-checks the fence check schedules for itself (the handlers share this client).
    const deferrals: number[] = [];
    const send = fixture.stack.queues.send;
    fixture.stack.queues.send = async (queue, body, options) => {
      const parsed =
        typeof body === 'object' && body !== null ? (body as { runId?: string; deferrals?: number }) : {};
      if (queue === QueueName.RUN_FINISHED && parsed.runId === root.runId && parsed.deferrals) {
        deferrals.push(parsed.deferrals);
      }
      return send(queue, body, options);
    };
    // The child outlives its root: several deferred fence checks, the fence stays, the sandbox lives.
    await eventually('three deferred fence checks', async () => deferrals.length >= 3, 20_000);
    fixture.stack.queues.send = send;
    expect(deferrals).toEqual([1, 2, 3]);
    expect(await fenceOf(fixture.t.db, root.runId)).toBe(true);
    expect(fixture.stack.provisioner!.sandbox(root.sandboxId)).toBeDefined();
    expect(deletesOf(root.sandboxId)).toEqual([]);
    expect(await deadLettersOf(QueueName.RUN_FINISHED, root.runId)).toEqual([]);

    await fixture.stack.platform.finishRun(child, 'completed');
    await eventually(
      'the fence to clear after the child ended',
      async () => !(await fenceOf(fixture.t.db, root.runId)),
      20_000,
    );
    expect(fixture.stack.provisioner!.sandbox(root.sandboxId)).toBeUndefined();
    expect(await deadLettersOf(QueueName.RUN_FINISHED, root.runId)).toEqual([]);
  });
});
