import { describe, expect, it } from 'vitest';
import { QueueName } from '../../functions/adapters/queues.ts';
import type { AdmittedRun } from '../../infra/local/platform.ts';
import type { ChildRun } from '../support/child-process.ts';
import { fenceOf } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { runOpsCli } from '../support/ops-cli.ts';
import { isDeleteOf } from '../support/probes.ts';
import { eventually } from '../support/stack.ts';

/**
 * Issue 11.1, reproduced through the local stack with the provisioner behaving like the
 * platform's deployed one (POST hands out the live sandbox again, DELETE ignores the generation):
 *
 *   run A ends; its release passes the guard and sends the DELETE; the provisioner is slow; an
 *   operator runs `ops force-clear A` meanwhile; the platform admits run B with its admission SQL
 *   and B is handed the still-live sandbox; then A's DELETE lands.
 *
 * Claim: no sandbox generation is ever deleted while a run that uses it is active. Before the fix
 * force-clear went through, B reused the sandbox and A's late DELETE removed it under the running
 * B. The provisioner holds A's DELETE (a `hang` released by the test) so that "meanwhile" is as
 * long as the operator and the platform need, on any machine.
 */

const fixture = useStackFixture({ stack: { provisionerMode: 'platform' } });

function ops(args: string[]): Promise<ChildRun> {
  const env: Record<string, string | undefined> = {
    DATABASE_URL: fixture.t.url,
    DATABASE_WS_PROXY: fixture.t.wsProxy,
    AWS_ENDPOINT_URL_SQS: fixture.stack.sqsEndpoint,
    QUEUE_NAME_PREFIX: '',
  };
  return runOpsCli(args, {
    env: env as NodeJS.ProcessEnv,
    timeoutMs: 60_000,
  });
}

describe('issue 11.1: ops force-clear while a release DELETE is in flight', () => {
  it('never lets the late DELETE remove the sandbox of a run admitted meanwhile', async () => {
    const { stack } = fixture;
    const provisioner = stack.provisioner!;
    expect(provisioner.mode).toBe('platform');
    const scope = await stack.platform.createScope();
    const a = (await stack.platform.admitRootRun(scope))!;

    // The provisioner is slow: A's DELETE arrives and is held there.
    provisioner.setFault(a.sandboxId, { hang: true, times: 1 });
    await stack.platform.finishRun(a.runId, 'completed');
    const deleteOfA = await provisioner.waitForRequest(isDeleteOf(a.sandboxId), 30_000);

    // Meanwhile: the operator force-clears A through the real CLI, and the platform tries to admit B.
    const forced = await ops([
      'force-clear',
      a.runId,
      '--reason',
      'INC-11: stuck release',
      '--yes',
      '--actor',
      'op',
    ]);
    const admittedMeanwhile = await stack.platform.admitRootRun(scope);

    // A's DELETE lands.
    provisioner.clearFaults(a.sandboxId);
    await eventually('A’s DELETE answered', async () =>
      provisioner.audit().find((entry) => entry.seq === deleteOfA.seq && entry.endedAt !== undefined),
    );
    // The platform keeps trying until the scope is free; then B runs.
    const b: AdmittedRun =
      admittedMeanwhile ?? (await eventually('B admitted', async () => stack.platform.admitRootRun(scope)));
    const bAdmittedAt = Date.now();

    // The claim: B's sandbox is alive while B is running, and no DELETE removed it since B began.
    expect(provisioner.sandbox(b.sandboxId)).toMatchObject({ generation: b.generation, alive: true });
    const deletesOfB = provisioner
      .audit()
      .filter(
        (entry) =>
          entry.method === 'DELETE' &&
          entry.sandboxId === b.sandboxId &&
          entry.deletedGeneration === b.generation &&
          (entry.endedAt ?? Number.POSITIVE_INFINITY) >= bAdmittedAt - 60_000 &&
          entry.seq !== deleteOfA.seq,
      );
    expect(deletesOfB).toEqual([]);

    // How it was kept safe: force-clear refused (exit 4) naming the delete in flight and when it may
    // end; admission was refused while the DELETE was in flight; A was cleaned by its own release.
    expect(forced.code).toBe(4);
    expect(forced.stderr).toContain('DELETE_IN_FLIGHT');
    expect(forced.stderr).toMatch(/may still be in flight at the provisioner until \d{4}-\d\d-\d\dT/);
    expect(forced.stderr).toContain('Try again after');
    expect(admittedMeanwhile).toBeUndefined();
    await eventually(
      'A’s fence cleared by its own cleanup',
      async () => !(await fenceOf(fixture.t.db, a.runId)),
    );
    expect(b.generation).toBe(a.generation + 1);
    const { rows } = await fixture.t.db.query<{ overrides: number }>(
      'SELECT count(*)::int AS overrides FROM runtime_cleanup_overrides WHERE run_id = $1::text',
      [a.runId],
    );
    expect(rows[0]!.overrides).toBe(0);
    for (const queue of [QueueName.RUN_FINISHED, QueueName.RUNTIME_RELEASE, QueueName.RUNTIME_FINALIZE]) {
      expect(await stack.deadLetters(queue)).toEqual([]);
    }
  });
});
