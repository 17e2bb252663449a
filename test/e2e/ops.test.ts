/**
 * The operator CLI as an operator runs it: a child process (the bundle the `runtime-cleanup-ops` bin
 * runs, support/ops-cli.ts) against this file's own local stack.
 */
import { randomUUID } from 'node:crypto';
import type { Message } from '@aws-sdk/client-sqs';
import { GetQueueAttributesCommand } from '@aws-sdk/client-sqs';
import { describe, expect, it } from 'vitest';
import type { FinalizeCommand, ReleaseCommand } from '../../functions/adapters/messages.ts';
import { releaseGroupId } from '../../functions/adapters/publish.ts';
import { QueueName } from '../../functions/adapters/queues.ts';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import type { ChildRun } from '../support/child-process.ts';
import { fenceOf, finishedRootRun } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { holdScopeAdvisoryLockUnbounded } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

/**
 * A CLI process's bound: the first test starts twelve at once beside the rest of the suite on two
 * cores (seen: 33 s under a loaded machine when each compiled the CLI with tsx). The tests' own
 * timeouts stay above it, so a hung CLI is reported as its own failure.
 */
const CHILD_TIMEOUT_MS = 90_000;

const fixture = useStackFixture();

function ops(args: string[], env: Record<string, string | undefined> = {}): Promise<ChildRun> {
  return runOpsCli(args, {
    env: {
      DATABASE_URL: fixture.t.url,
      DATABASE_WS_PROXY: fixture.t.wsProxy,
      AWS_ENDPOINT_URL_SQS: fixture.stack.sqsEndpoint,
      QUEUE_NAME_PREFIX: '',
      ...env,
    },
    timeoutMs: CHILD_TIMEOUT_MS,
  });
}

/** Parses --json output, with the whole run in the failure message when it is not JSON. */
function json<T = Record<string, unknown>>(run: ChildRun): T {
  try {
    return JSON.parse(run.stdout) as T;
  } catch {
    throw new Error(`not JSON (exit ${run.code}):\n${run.stdout}\nstderr:\n${run.stderr}`);
  }
}

async function cleanedEvents(runId: string, collected: Array<Record<string, unknown>>) {
  for (const message of await fixture.stack.drain(QueueName.RUNTIME_CLEANED)) {
    const body = JSON.parse(message.Body!) as Record<string, unknown>;
    if (body.runId === runId) collected.push(body);
  }
  return collected;
}

async function deadLettersOf(queue: string, runId: string): Promise<Message[]> {
  return (await fixture.stack.deadLetters(queue)).filter((m) => m.Body?.includes(runId));
}

describe('ops CLI: usage, configuration and unreachable dependencies', {
  timeout: CHILD_TIMEOUT_MS + 60_000,
}, () => {
  it('answers each failure with its exit code and one clear line, never printing a password', async () => {
    const closedPort = await freePort();
    const secret = `pw-${randomUUID().slice(0, 8)}`;
    const fenced = await finishedRootRun(fixture.t.db);
    const busy = await finishedRootRun(fixture.t.db);
    const lock = await holdScopeAdvisoryLockUnbounded(fixture.t.url, busy);
    const busyClear = ops(['force-clear', busy.rootRunId, '--reason', 'test', '--yes'], {
      DATABASE_LOCK_TIMEOUT_MS: '300',
    });
    const [
      help,
      commandHelp,
      unknown,
      noDb,
      noSqs,
      unknownRun,
      unknownRetry,
      badQueue,
      badValue,
      badLadder,
      halfExplained,
    ] = await Promise.all([
      ops(['--help']),
      ops(['help', 'force-clear']),
      ops(['frobnicate']),
      ops(['fences'], { DATABASE_URL: `postgres://postgres:${secret}@127.0.0.1:${closedPort}/postgres` }),
      ops(['dlq', '--json'], { AWS_ENDPOINT_URL_SQS: `http://127.0.0.1:${closedPort}` }),
      ops(['explain', 'run-does-not-exist', '--json']),
      ops(['retry', 'run-does-not-exist']),
      ops(['redrive', 'no-such-queue']),
      ops(['check-config'], { SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '10' }),
      ops(['check-config', '--json'], { SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '200' }),
      ops(['explain', fenced.rootRunId, '--json'], {
        AWS_ENDPOINT_URL_SQS: `http://127.0.0.1:${closedPort}`,
      }),
    ]);
    const busyResult = await busyClear;
    await lock.release();

    expect(help.code).toBe(0);
    for (const line of ['0  ok', '1  refused', '2  bad usage', '3  database or SQS unreachable', '4  busy']) {
      expect(help.stdout).toContain(line);
    }
    expect(commandHelp).toMatchObject({ code: 0, stdout: expect.stringContaining('--reason <text>') });
    expect(unknown).toMatchObject({
      code: 2,
      stderr: expect.stringContaining('unknown command "frobnicate"'),
    });

    expect(noDb.code).toBe(3);
    expect(noDb.stderr).toMatch(/cannot connect to the database.*DATABASE_UNAVAILABLE/);
    expect(noDb.stderr).toContain(`127.0.0.1:${closedPort}`);
    expect(noDb.stdout + noDb.stderr).not.toContain(secret);

    expect(noSqs.code).toBe(3);
    expect(json(noSqs)).toMatchObject({ error: { code: 'QUEUE_UNAVAILABLE', exitCode: 3 } });
    expect(noSqs.stderr).toContain(`SQS: http://127.0.0.1:${closedPort}`);

    expect(unknownRun.code).toBe(1);
    expect(json(unknownRun)).toMatchObject({
      error: { code: 'RUN_NOT_FOUND', message: 'agent run "run-does-not-exist" does not exist' },
    });
    expect(unknownRetry).toMatchObject({ code: 1, stderr: expect.stringContaining('RUN_NOT_FOUND') });
    expect(badQueue.code).toBe(2);
    expect(badQueue.stderr).toContain('valid queues: run-finished, runtime-release.fifo, runtime-finalize');

    // Bad configuration: exactly the one ConfigError line, for loadConfig's rules and the ladder's.
    expect(badValue.code).toBe(2);
    expect(badValue.stderr.trim().split('\n')).toEqual([
      'SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS="10" is invalid: must be greater than lock wait + delete timeout (30 + 120 = 150)',
    ]);
    expect(badLadder.code).toBe(2);
    expect(json(badLadder)).toMatchObject({
      error: { code: 'CONFIG_INVALID', message: expect.stringContaining('release function timeout (180 s') },
    });

    // The database half of explain is still shown; the exit code says the dead letters are unknown.
    expect(halfExplained.code).toBe(3);
    expect(json(halfExplained)).toMatchObject({
      run: { runId: fenced.rootRunId, fencePending: true },
      scope: { blocked: true, sandbox: { sandboxId: fenced.sandboxId, generation: fenced.generation } },
      deadLetters: [],
      deadLettersComplete: null,
      deadLettersError: expect.stringContaining('ECONNREFUSED'),
    });

    // A cleanup holding the scope's lock makes force-clear give up by lock_timeout, changing nothing.
    expect(busyResult.code).toBe(4);
    expect(busyResult.stderr).toContain('DATABASE_LOCK_TIMEOUT');
    expect(await fenceOf(fixture.t.db, busy.rootRunId)).toBe(true);
  });

  it('check-config prints the timeout ladder, every rung holding', async () => {
    const run = await ops(['check-config', '--json'], {
      SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '20',
    });
    expect(run.code).toBe(0);
    const result = json<{ ladder: Array<{ rule: string; holds: boolean; left: number; right: number }> }>(
      run,
    );
    expect(result.ladder).toEqual(
      expect.arrayContaining([
        { rule: 'lock wait + delete timeout < cleanup timeout', holds: true, left: 140, right: 155 },
        { rule: 'cleanup timeout < release function timeout', holds: true, left: 155, right: 180 },
        {
          rule: 'database connect + query timeout + 5 s ≤ shortest consumer function timeout',
          holds: true,
          left: 30,
          right: 30,
        },
        {
          rule: 'runtime-release.fifo visibility ≥ 6 × release function timeout',
          holds: true,
          left: 1080,
          right: 1080,
        },
      ]),
    );
    expect(result.ladder.every((check) => check.holds)).toBe(true);
  });
});

describe('ops CLI against the local stack', { timeout: CHILD_TIMEOUT_MS + 60_000 }, () => {
  it('fences lists an unannounced fence with its generation, and retry gets it cleaned', async () => {
    const scope = await fixture.stack.platform.createScope();
    const run = (await fixture.stack.platform.admitRootRun(scope))!;
    await fixture.stack.platform.finishRun(run.runId, 'completed', { announce: false });

    const [listed, table] = await Promise.all([ops(['fences', '--json']), ops(['fences'])]);
    expect(listed.code).toBe(0);
    const fence = json<{ fences: Array<Record<string, unknown>> }>(listed).fences.find(
      (f) => f.runId === run.runId,
    );
    expect(fence).toMatchObject({
      uid: scope.uid,
      runtimeScopeId: scope.runtimeScopeId,
      status: 'completed',
      lastAnnouncedAt: null,
      sandbox: { sandboxId: run.sandboxId, generation: run.generation, releasedAt: null },
    });
    expect(fence!.ageSeconds).toBeGreaterThanOrEqual(0);
    expect(table.stdout).toMatch(/RUN\s+UID\s+SCOPE\s+STATUS\s+PENDING SINCE\s+AGE/);
    expect(table.stdout).toContain(run.runId);

    const retried = await ops(['retry', run.runId, '--json']);
    expect(retried.code).toBe(0);
    expect(json(retried)).toMatchObject({ runId: run.runId, queue: 'run-finished' });
    await eventually('fence cleared after retry', async () => !(await fenceOf(fixture.t.db, run.runId)));
    expect(fixture.stack.provisioner!.sandbox(run.sandboxId)).toBeUndefined();

    const again = await ops(['retry', run.runId, '--json']);
    expect(again.code).toBe(1);
    expect(json(again)).toMatchObject({ error: { code: 'FENCE_NOT_PENDING' } });
  });

  it('dlq shows a malformed message with its reason; redrive moves it back and it dead-letters again', async () => {
    await fixture.stack.queues.send(QueueName.RUN_FINISHED, 'not json');
    const [original] = await eventually('malformed message dead-lettered', async () => {
      const letters = await fixture.stack.deadLetters(QueueName.RUN_FINISHED);
      return letters.length === 1 ? letters : undefined;
    });

    type DlqReport = {
      queues: Array<{
        queue: string;
        messages: number;
        reasons: Array<{ errorCode: string; reason: string; count: number }>;
      }>;
    };
    const runFinishedReport = (run: ChildRun) =>
      json<DlqReport>(run).queues.find((q) => q.queue === 'run-finished');
    const before = await ops(['dlq', '--json']);
    expect(before.code).toBe(0);
    expect(runFinishedReport(before)).toEqual({
      queue: 'run-finished',
      deadLetterQueue: 'run-finished-dlq',
      messages: 1,
      visible: expect.any(Number),
      inFlight: expect.any(Number),
      peeked: 1,
      complete: true,
      incompleteBecause: null,
      reasons: [
        { errorCode: 'MESSAGE_INVALID', reason: expect.stringContaining('not valid JSON'), count: 1 },
      ],
    });

    const redriven = await ops(['redrive', 'run-finished', '--json']);
    expect(redriven.code).toBe(0);
    // fauxqs has no StartMessageMoveTask: the by-hand move is used and says so.
    expect(json(redriven)).toMatchObject({ queue: 'run-finished', method: 'resend', moved: 1, skipped: 0 });

    // It went through run-finished again (a new source message) and was dead-lettered anew.
    const [again] = await eventually('redriven message dead-lettered again', async () => {
      const letters = await fixture.stack.deadLetters(QueueName.RUN_FINISHED);
      return letters.length === 1 && letters[0]!.MessageId !== original!.MessageId ? letters : undefined;
    });
    expect(again!.Body).toBe('not json');
    expect(again!.MessageAttributes?.sourceMessageId?.StringValue).not.toBe(
      original!.MessageAttributes?.sourceMessageId?.StringValue,
    );
    expect(runFinishedReport(await ops(['dlq', '--json']))).toMatchObject({ messages: 1 });
  });

  it('force-clear ends a cleanup that can never succeed, audited and announced, and late duplicates are harmless', async () => {
    const scope = await fixture.stack.platform.createScope();
    const run = (await fixture.stack.platform.admitRootRun(scope))!;
    // The provisioner insists on an older generation: GENERATION_ANOMALY, dead-lettered at once.
    fixture.stack.provisioner!.setFault(run.sandboxId, { conflictGeneration: run.generation - 1 });
    await fixture.stack.platform.finishRun(run.runId, 'completed');
    const [letter] = await eventually('release dead-lettered', async () => {
      const letters = await deadLettersOf(QueueName.RUNTIME_RELEASE, run.runId);
      return letters.length ? letters : undefined;
    });
    expect(letter!.MessageAttributes?.errorCode?.StringValue).toBe('GENERATION_ANOMALY');
    expect(await fenceOf(fixture.t.db, run.runId)).toBe(true);

    const reason = 'provisioner reports generation 0 for sbx at 1; INC-7';
    const [noReason, dryRun] = await Promise.all([
      ops(['force-clear', run.runId, '--yes']),
      ops(['force-clear', run.runId, '--reason', reason]),
    ]);
    expect(noReason).toMatchObject({ code: 2, stderr: expect.stringContaining('--reason') });
    expect(dryRun.code).toBe(0);
    expect(dryRun.stdout).toContain('Dry run: nothing was changed');
    expect(dryRun.stdout).toContain(
      `Sandbox ${run.sandboxId} generation ${run.generation} was not confirmed deleted`,
    );
    expect(dryRun.stdout).not.toMatch(/curl|-X DELETE/);
    expect(await fenceOf(fixture.t.db, run.runId)).toBe(true);

    const forced = await ops(
      ['force-clear', run.runId, '--reason', reason, '--yes', '--actor', 'e2e-op', '--json'],
      {
        POWERTOOLS_METRICS_DISABLED: undefined,
      },
    );
    expect(forced.code).toBe(0);
    expect(json(forced)).toMatchObject({
      applied: true,
      runId: run.runId,
      actor: 'e2e-op',
      reason,
      sandbox: { sandboxId: run.sandboxId, generation: run.generation },
      overrideId: expect.any(Number),
      published: { queue: 'runtime-cleaned', messageId: expect.any(String) },
    });
    // Never silent: the WARN line on stderr, not in the JSON. ForcedClears is counted by the
    // deployed sweeper from the audit row (template-production.test.ts), not printed here, where
    // CloudWatch would never see it.
    expect(forced.stderr).toContain('fence force-cleared by an operator');
    expect(forced.stderr).not.toMatch(/"ForcedClears"/);
    expect(await fenceOf(fixture.t.db, run.runId)).toBe(false);

    const events: Array<Record<string, unknown>> = [];
    await eventually(
      'runtime-cleaned with forced: true',
      async () => (await cleanedEvents(run.runId, events)).length,
    );
    expect(events).toEqual([
      expect.objectContaining({ runId: run.runId, generation: run.generation, forced: true }),
    ]);

    const [explained, history, twice] = await Promise.all([
      ops(['explain', run.runId, '--json']),
      ops(['fences', '--history', '--json']),
      ops(['force-clear', run.runId, '--reason', reason, '--yes', '--json']),
    ]);
    expect(explained.code).toBe(0);
    expect(json(explained)).toMatchObject({
      run: { runId: run.runId, fencePending: false, status: 'completed' },
      // Not marked released: nothing confirmed it gone, so the scope's next cleanup deletes it.
      scope: {
        blocked: false,
        sandbox: { generation: run.generation, releasedAt: null },
        deleteInFlight: null,
      },
      forcedClears: [{ runId: run.runId, actor: 'e2e-op', reason, sandboxId: run.sandboxId, generation: 1 }],
      deadLetters: [
        { deadLetterQueue: 'runtime-release-dlq.fifo', errorCode: 'GENERATION_ANOMALY', runId: run.runId },
      ],
      diagnosis: expect.arrayContaining([expect.stringContaining('force-cleared by e2e-op')]),
    });
    expect(json<{ forcedClears: Array<{ runId: string }> }>(history).forcedClears).toEqual(
      expect.arrayContaining([expect.objectContaining({ runId: run.runId, actor: 'e2e-op' })]),
    );
    expect(twice.code).toBe(1);
    expect(json(twice)).toMatchObject({ error: { code: 'FENCE_NOT_PENDING' } });

    // The scope moves on: the next run is handed the still-live sandbox (the provisioner reuses it).
    fixture.stack.provisioner!.clearFaults(run.sandboxId);
    const next = (await fixture.stack.platform.admitRootRun(scope))!;
    expect(next).toMatchObject({ sandboxId: run.sandboxId, generation: run.generation });
    const live = fixture.stack.provisioner!.sandbox(next.sandboxId)!;

    // Late duplicates of the old cleanup: its release command (from the DLQ) and a finalize.
    const oldRelease = JSON.parse(letter!.Body!) as ReleaseCommand;
    const { requestedAt: _, ...identity } = oldRelease;
    const oldFinalize: FinalizeCommand = {
      ...identity,
      releaseOutcome: 'deleted',
      releasedAt: new Date().toISOString(),
    };
    const auditBefore = fixture.stack.provisioner!.audit().length;
    await fixture.stack.queues.send(QueueName.RUNTIME_RELEASE, oldRelease, {
      groupId: releaseGroupId(oldRelease.uid, oldRelease.runtimeScopeId),
      deduplicationId: randomUUID(),
    });
    await fixture.stack.queues.send(QueueName.RUNTIME_FINALIZE, oldFinalize);
    // The stale release is consumed without a delete: its guard sees that the fence it was for is
    // gone (the generation guard alone could not tell the reused generation apart: it is the same).
    await eventually('the stale release consumed', async () => {
      const { Attributes } = await fixture.stack.sqs.send(
        new GetQueueAttributesCommand({
          QueueUrl: fixture.stack.queueUrl(QueueName.RUNTIME_RELEASE),
          AttributeNames: ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible'],
        }),
      );
      return (
        Attributes?.ApproximateNumberOfMessages === '0' &&
        Attributes.ApproximateNumberOfMessagesNotVisible === '0'
      );
    });
    // The finalize duplicate finds the fence clear and only repeats runtime-cleaned (unforced).
    const repeats: Array<Record<string, unknown>> = [];
    await eventually(
      'the duplicate finalized',
      async () => (await cleanedEvents(run.runId, repeats)).length >= 1,
    );
    expect(repeats.every((event) => event.forced === undefined)).toBe(true);
    const deletesSince = fixture.stack
      .provisioner!.audit()
      .slice(auditBefore)
      .filter((entry) => entry.method === 'DELETE');
    expect(deletesSince).toEqual([]);
    expect(fixture.stack.provisioner!.sandbox(next.sandboxId)).toMatchObject({
      generation: next.generation,
      alive: true,
    });
    expect(fixture.stack.provisioner!.isProcessAlive(live.pid)).toBe(true);
    expect(await fenceOf(fixture.t.db, run.runId)).toBe(false);
    const { rows } = await fixture.t.db.query<{ generation: string; released_at: Date | null }>(
      'SELECT generation, released_at FROM sandbox_runtimes WHERE uid = $1::text AND runtime_scope_id = $2::text',
      [scope.uid, scope.runtimeScopeId],
    );
    expect(rows[0]).toEqual({ generation: String(next.generation), released_at: null });
    expect(await deadLettersOf(QueueName.RUNTIME_FINALIZE, run.runId)).toEqual([]);
    expect(await deadLettersOf(QueueName.RUNTIME_RELEASE, run.runId)).toHaveLength(1);
  });
});
