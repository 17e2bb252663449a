/**
 * `ops force-clear --yes` whose COMMIT took effect but whose answer was lost. Retried (by the
 * database adapter on a fresh connection, or by the operator running it again), it must not
 * answer "no pending fence" and skip publishing: it recognises its own earlier clear by the audit
 * row (same run, actor and reason), publishes `runtime-cleaned` and exits 0, saying so.
 */
import { randomUUID } from 'node:crypto';
import { ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QueueName } from '../../functions/adapters/queues.ts';
import { fenceCheck } from '../../functions/cleanup/fence-check.ts';
import { beginRelease, ReleaseGuard } from '../../functions/cleanup/release-guard.ts';
import { type AnswerDroppingProxy, startAnswerDroppingProxy } from '../support/answer-dropping-proxy.ts';
import type { ChildRun } from '../support/child-process.ts';
import { createTestDatabase, type TestDatabase } from '../support/database.ts';
import { fenceOf, finishedRootRun, insertOtherRun } from '../support/factories.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { releaseNeeded } from '../support/probes.ts';
import { type SqsEmulator, startSqsEmulator } from '../support/sqs-emulator.ts';

let t: TestDatabase;
let sqs: SqsEmulator;
let proxy: AnswerDroppingProxy;
let proxiedUrl: string;

beforeAll(async () => {
  t = await createTestDatabase();
  sqs = await startSqsEmulator();
  const direct = new URL(t.url);
  proxy = await startAnswerDroppingProxy({ host: direct.hostname, port: Number(direct.port) });
  direct.host = `127.0.0.1:${proxy.port}`;
  proxiedUrl = direct.toString();
});
afterAll(async () => {
  await proxy?.close();
  await sqs?.stop();
  await t?.drop();
});

function ops(args: string[]): Promise<ChildRun> {
  const env: NodeJS.ProcessEnv = {
    // Through the proxy, by the CLI's own in-process bridge.
    DATABASE_URL: proxiedUrl,
    AWS_ENDPOINT_URL_SQS: sqs.endpoint,
    QUEUE_NAME_PREFIX: '',
    // Removed, not inherited from the worker (runOpsCli drops what is undefined).
    DATABASE_WS_PROXY: undefined,
  };
  return runOpsCli(args, { env, timeoutMs: 60_000 });
}

async function cleanedEventsOf(runId: string): Promise<Array<Record<string, unknown>>> {
  const url = sqs.queues.get(QueueName.RUNTIME_CLEANED)!.url;
  const events: Array<Record<string, unknown>> = [];
  for (;;) {
    const { Messages } = await sqs.client.send(
      new ReceiveMessageCommand({
        QueueUrl: url,
        MaxNumberOfMessages: 10,
        WaitTimeSeconds: 0,
        VisibilityTimeout: 60,
      }),
    );
    if (!Messages?.length) return events;
    for (const message of Messages) {
      const body = JSON.parse(message.Body!) as Record<string, unknown>;
      if (body.runId === runId) events.push(body);
    }
  }
}

async function overridesOf(runId: string): Promise<number> {
  const { rows } = await t.db.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM runtime_cleanup_overrides WHERE run_id = $1::text',
    [runId],
  );
  return rows[0]!.n;
}

describe('force-clear whose COMMIT answer is lost', () => {
  it('the adapter retries on a fresh connection, recognises the clear it made, publishes and exits 0', async () => {
    const scenario = await finishedRootRun(t.db);
    const reason = `stuck provisioner ${randomUUID().slice(0, 6)}`;
    proxy.dropCommitAnswerAfter(scenario.rootRunId);
    const run = await ops([
      'force-clear',
      scenario.rootRunId,
      '--reason',
      reason,
      '--actor',
      'oncall-a',
      '--yes',
    ]);
    expect(proxy.dropped, 'the COMMIT answer was dropped').toBe(1);
    expect(run.code, run.stdout + run.stderr).toBe(0);
    expect(run.stdout).toContain('Already done: your earlier attempt force-cleared the fence');
    expect(run.stdout).toMatch(/published {2}runtime-cleaned \(forced: true\), message /);
    expect(await fenceOf(t.db, scenario.rootRunId)).toBe(false);
    expect(await overridesOf(scenario.rootRunId)).toBe(1);
    const events = await cleanedEventsOf(scenario.rootRunId);
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ runId: scenario.rootRunId, forced: true });
  });

  it('the operator running it again finishes it too; another reason or actor is still told there is no fence', async () => {
    const scenario = await finishedRootRun(t.db);
    const args = ['force-clear', scenario.rootRunId, '--reason', 'stuck', '--actor', 'oncall-b', '--yes'];
    const first = await ops(args);
    expect(first.code, first.stderr).toBe(0);
    expect(first.stdout).toContain('Force-cleared the fence');

    const again = await ops([...args, '--json']);
    expect(again.code, again.stderr).toBe(0);
    const output = JSON.parse(again.stdout) as {
      alreadyCleared: boolean;
      applied: boolean;
      published: unknown;
    };
    expect(output).toMatchObject({ alreadyCleared: true, applied: true });
    expect(output.published).not.toBeNull();

    const otherReason = await ops([
      'force-clear',
      scenario.rootRunId,
      '--reason',
      'other',
      '--actor',
      'oncall-b',
      '--yes',
    ]);
    expect(otherReason.code).toBe(1);
    expect(otherReason.stderr).toContain('[FENCE_NOT_PENDING]');
    const otherActor = await ops([
      'force-clear',
      scenario.rootRunId,
      '--reason',
      'stuck',
      '--actor',
      'oncall-c',
      '--yes',
    ]);
    expect(otherActor.code).toBe(1);
    expect(await overridesOf(scenario.rootRunId)).toBe(1);
    expect(await cleanedEventsOf(scenario.rootRunId)).toHaveLength(2);
  });

  it('the retry refuses with exit 4 and announces nothing while the scope is blocked now (a sibling deleting, or fenced)', async () => {
    const scenario = await finishedRootRun(t.db);
    const args = ['force-clear', scenario.rootRunId, '--reason', 'stuck', '--actor', 'oncall-d', '--yes'];
    const first = await ops(args);
    expect(first.code, first.stderr).toBe(0);
    expect(await cleanedEventsOf(scenario.rootRunId)).toHaveLength(1);

    // Before the operator retries, another root run of the scope ends: its fence blocks the scope ...
    const sibling = await insertOtherRun(t.db, scenario, {
      runType: 'resume',
      status: 'completed',
      fence: true,
    });
    const fenced = await ops(args);
    expect(fenced.code, fenced.stdout + fenced.stderr).toBe(4);
    expect(fenced.stderr).toContain('[SCOPE_BLOCKED]');
    expect(fenced.stderr).toContain('your earlier attempt did force-clear the fence');

    // ... and then its release starts deleting: a DELETE in flight, as forceClear itself refuses.
    const identity = releaseNeeded(await fenceCheck(t.db, sibling));
    const guard = await beginRelease(
      t.db,
      { ...identity, sandboxId: identity.sandboxId!, generation: identity.generation! },
      { inFlightSeconds: 600, lockTimeoutMs: 5_000 },
    );
    expect(guard.verdict).toBe(ReleaseGuard.PROCEED);
    const deleting = await ops(args);
    expect(deleting.code, deleting.stdout + deleting.stderr).toBe(4);
    expect(deleting.stderr).toContain('[DELETE_IN_FLIGHT]');
    expect(deleting.stderr).toContain(`the release of run ${sibling}`);

    expect(await overridesOf(scenario.rootRunId)).toBe(1);
    expect(await cleanedEventsOf(scenario.rootRunId)).toHaveLength(0);
  });
});
