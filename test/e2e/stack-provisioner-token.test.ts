/**
 * `npm run stack` with SANDBOX_PROVISIONER_TOKEN: its built-in provisioner requires the token, and
 * the functions (and the local platform) send it, so cleanups run end to end. Given only the
 * deployed SANDBOX_PROVISIONER_TOKEN_PARAMETER the stack stops at start instead of sending none.
 */
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../functions/adapters/errors.ts';
import { startStack } from '../../infra/local/stack.ts';
import { fenceOf } from '../support/factories.ts';
import { useStackFixture } from '../support/fixtures.ts';
import { fencesCleared } from '../support/stack.ts';

const TOKEN = 'stack-token.Rt5w';
const fixture = useStackFixture({ env: { SANDBOX_PROVISIONER_TOKEN: TOKEN }, stack: { reclaimer: false } });

describe('the local stack with SANDBOX_PROVISIONER_TOKEN', () => {
  it('cleans up end to end, every request to its provisioner carrying the token', async () => {
    const { platform, provisioner } = fixture.stack;
    const scope = await platform.createScope();
    const run = (await platform.admitRootRun(scope))!;
    await platform.finishRun(run.runId, 'completed');

    await fencesCleared(fixture.t.db, [run.runId]);

    expect(await fenceOf(fixture.t.db, run.runId)).toBe(false);
    expect(provisioner!.sandbox(run.sandboxId)).toBeUndefined();
    const statuses = provisioner!
      .audit()
      .filter((entry) => entry.sandboxId === run.sandboxId)
      .map((entry) => `${entry.method} ${entry.status}`);
    expect(statuses).toEqual(['POST 201', 'DELETE 200']);
  });

  it('its built-in provisioner refuses a request without the token', async () => {
    const response = await fetch(`${fixture.stack.provisionerUrl}/api/sandboxes`);
    await response.body?.cancel();
    expect(response.status).toBe(401);
    expect(response.headers.get('www-authenticate')).toMatch(/^Bearer/);
  });

  it('stops at start given only SANDBOX_PROVISIONER_TOKEN_PARAMETER, naming the way to export it', async () => {
    const starting = startStack({
      env: { SANDBOX_PROVISIONER_TOKEN_PARAMETER: '/runtime-cleanup/dev/sandbox-provisioner-token' },
      databaseUrl: fixture.t.url,
      sqsPort: 0,
    });
    await expect(starting).rejects.toBeInstanceOf(ConfigError);
    await expect(starting).rejects.toThrow(/SANDBOX_PROVISIONER_TOKEN.*is required here.*get-parameter/);
  });
});
