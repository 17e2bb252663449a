/**
 * `npm run smoke`, the post-deploy smoke check, as a team runs it: a child process against a
 * deployed stage. Here the stage is this file's own local stack (startTestStack), reached the way
 * the check reaches LocalStack: an SQS endpoint (AWS_ENDPOINT_URL_SQS), a database URL and a
 * provisioner URL, with the stack's base queue names (QUEUE_NAME_PREFIX empty) in place of the
 * local stage's `local-` ones. LocalStack itself cannot run here (no Docker).
 */
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { describe, expect, it } from 'vitest';
import { QueueName } from '../../functions/adapters/queues.ts';
import { freePort } from '../../infra/local/embedded-postgres.ts';
import { SMOKE_UID } from '../../infra/smoke/smoke.ts';
import type { ChildRun } from '../support/child-process.ts';
import { runCommand } from '../support/commands.ts';
import { useSqsFixture, useStackFixture } from '../support/fixtures.ts';

/** A bound for a child that hangs, far above a start on two loaded cores. */
const CHILD_TIMEOUT_MS = 120_000;

const fixture = useStackFixture();
/** An SQS emulator with every queue and nobody consuming them: a stage whose functions never run. */
const idle = useSqsFixture();

function smoke(args: string[], env: Record<string, string | undefined>): Promise<ChildRun> {
  const childEnv: Record<string, string | undefined> = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    ...env,
  };
  for (const [key, value] of Object.entries(childEnv)) if (value === undefined) delete childEnv[key];
  return runCommand('smoke', args, { env: childEnv as NodeJS.ProcessEnv, timeoutMs: CHILD_TIMEOUT_MS });
}

/** The stack's endpoints, as the smoke check's variables name them. */
const stackEnv = () => ({
  AWS_ENDPOINT_URL_SQS: fixture.stack.sqsEndpoint,
  QUEUE_NAME_PREFIX: '',
  DATABASE_URL: fixture.t.url,
  DATABASE_WS_PROXY: fixture.t.wsProxy,
  SANDBOX_PROVISIONER_URL: fixture.stack.provisionerUrl,
});

const runIdOf = (run: ChildRun) => /passed: run (\S+) cleaned/.exec(run.stdout)?.[1];

describe('npm run smoke', () => {
  it('passes against a running stack: the run it records is cleaned, its event taken, every other event handed back', async () => {
    const foreign = JSON.stringify({
      runId: 'someone-elses-run',
      uid: 'u',
      runtimeScopeId: 's',
      generation: 1,
      cleanedAt: new Date().toISOString(),
    });
    await fixture.stack.sqs.send(
      new SendMessageCommand({
        QueueUrl: fixture.stack.queueUrl(QueueName.RUNTIME_CLEANED),
        MessageBody: foreign,
      }),
    );

    const run = await smoke(['--timeout-seconds', '60'], stackEnv());

    expect(run.code, `${run.stdout}\n${run.stderr}`).toBe(0);
    const runId = runIdOf(run);
    expect(runId, run.stdout).toBeDefined();
    expect(run.stdout).toContain('deleted at the provisioner');
    const { rows } = await fixture.t.db.query<{
      pending: boolean;
      uid: string;
      sandbox_id: string;
      released: boolean;
    }>(
      `SELECT r.runtime_cleanup_pending AS pending, r.uid, s.sandbox_id, s.released_at IS NOT NULL AS released
         FROM agent_runs r JOIN sandbox_runtimes s USING (uid, runtime_scope_id) WHERE r.id = $1::text`,
      [runId],
    );
    expect(rows).toEqual([
      { pending: false, uid: SMOKE_UID, sandbox_id: expect.any(String), released: true },
    ]);
    const listing = (await (await fetch(new URL('/api/sandboxes', fixture.stack.provisionerUrl))).json()) as {
      sandboxes: Array<{ sandbox_id: string }>;
    };
    expect(listing.sandboxes.map((sandbox) => sandbox.sandbox_id)).not.toContain(rows[0]!.sandbox_id);
    // Its own event was taken; the other consumer's is still there for it.
    const left = (await fixture.stack.drain(QueueName.RUNTIME_CLEANED)).map((message) => message.Body);
    expect(left).toEqual([foreign]);
  });

  it('fails in one line when the run is never cleaned, saying that its fence is still up', async () => {
    const run = await smoke(['--timeout-seconds', '2'], {
      ...stackEnv(),
      // The same database and provisioner, but queues nobody consumes.
      AWS_ENDPOINT_URL_SQS: idle.endpoint,
    });
    expect(run.code, `${run.stdout}\n${run.stderr}`).toBe(1);
    expect(run.stderr).toMatch(
      /smoke: FAILED: no runtime-cleaned event for run \S+ within 2 s: its fence is still up/,
    );
    expect(run.stderr).toContain('npm run ops -- explain');
  });

  it('says which endpoint it cannot reach, with exit status 3', async () => {
    const closed = `http://127.0.0.1:${await freePort()}`;
    const run = await smoke([], { ...stackEnv(), AWS_ENDPOINT_URL_SQS: closed });
    expect(run.code, run.stderr).toBe(3);
    expect(run.stderr).toMatch(/^smoke: QUEUE_UNAVAILABLE: SQS GetQueueUrl on runtime-cleaned failed/m);
  });

  it('needs DATABASE_URL for a real stage, and says how to get it (exit status 2)', async () => {
    const run = await smoke(['--stage', 'prod'], {});
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('DATABASE_URL is required for stage prod');
    expect(run.stderr).toContain('--name /runtime-cleanup/prod/database-url');
  });

  it('refuses an unknown option or a bad timeout before touching anything', async () => {
    const unknown = await smoke(['--stag', 'prod'], {});
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain("Unknown option '--stag'");
    const timeout = await smoke(['--timeout-seconds', '0'], {});
    expect(timeout.code).toBe(2);
    expect(timeout.stderr).toContain(
      '--timeout-seconds "0" must be a whole number of seconds from 1 to 3600',
    );
  });
});
