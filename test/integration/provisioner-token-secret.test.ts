/**
 * Deployed, the provisioner's token lives in an SSM SecureString (SANDBOX_PROVISIONER_TOKEN_PARAMETER)
 * that the release and reclaimer functions read at cold start, with the very reader that reads
 * DATABASE_URL_PARAMETER (adapters/ssm-secure-string.ts), and read once more after a 401. Proven
 * with the real SDK client against a real local HTTP server speaking GetParameter
 * (test/support/ssm-server.ts), the functions' real composition roots over
 * `deployedInfrastructure`, and a real HTTP provisioner that checks the token.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it, onTestFinished } from 'vitest';
import { loadConfig } from '../../functions/adapters/config.ts';
import { deployedInfrastructure } from '../../functions/adapters/deployed-infrastructure.ts';
import { InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import type { Infrastructure } from '../../functions/adapters/infrastructure.ts';
import { ProvisionerClient } from '../../functions/adapters/provisioner-client.ts';
import { provisionerTokenSource } from '../../functions/adapters/provisioner-token.ts';
import { createSsmClient } from '../../functions/adapters/ssm-secure-string.ts';
import { ReleaseOutcome } from '../../functions/cleanup/types.ts';
import { composeReclaimer } from '../../functions/reclaimer/handler.ts';
import { composeRelease } from '../../functions/release/handler.ts';
import { localLambdaContext } from '../../infra/local/event-source.ts';
import { captureOutput } from '../support/capture.ts';
import { useDatabaseFixture } from '../support/fixtures.ts';
import { rejectionOf } from '../support/probes.ts';
import { overrideProcessEnv } from '../support/process-env.ts';
import { type ScriptedProvisioner, startScriptedProvisioner } from '../support/scripted-provisioner.ts';
import { type LocalSsm, SDK_ENV, startLocalSsm } from '../support/ssm-server.ts';

const PARAMETER = '/runtime-cleanup/test/sandbox-provisioner-token';
const FIRST = 'first-token.Ab12';
const SECOND = 'second-token.Cd34';
const database = useDatabaseFixture();
let ssm: LocalSsm;
let provisioner: ScriptedProvisioner;
let accepted = FIRST;
let restoreEnv: (() => void) | undefined;

beforeAll(async () => {
  ssm = await startLocalSsm();
  provisioner = await startScriptedProvisioner({ acceptedToken: () => accepted });
  // The functions' telemetry reads LOG_LEVEL: only the refusals, which a test captures.
  restoreEnv = overrideProcessEnv({ ...SDK_ENV, AWS_ENDPOINT_URL_SSM: ssm.endpoint, LOG_LEVEL: 'ERROR' });
});
afterAll(async () => {
  restoreEnv?.();
  await provisioner?.close();
  await ssm?.close();
});
beforeEach(() => {
  ssm.requests.length = 0;
  provisioner.requests.length = 0;
  accepted = FIRST;
  ssm.put(PARAMETER, { type: 'SecureString', value: FIRST });
});

/** What a deployed release or reclaimer sees: the parameter's name, never the token. */
function lambdaEnv(): Record<string, string> {
  return {
    ...SDK_ENV,
    DATABASE_URL: database.t.url,
    DATABASE_WS_PROXY: database.t.wsProxy,
    SANDBOX_PROVISIONER_URL: provisioner.url,
    SANDBOX_PROVISIONER_TOKEN_PARAMETER: PARAMETER,
  };
}

/** The deployed infrastructure, with the database pools it opens ended after the test. */
function infrastructure(): Infrastructure {
  const deployed = deployedInfrastructure(lambdaEnv());
  return {
    ...deployed,
    async database(functionKey, telemetry) {
      const db = await deployed.database(functionKey, telemetry);
      onTestFinished(() => db.end());
      return db;
    },
  };
}

async function coldReclaimer() {
  const composed = await composeReclaimer(infrastructure());
  onTestFinished(() => composed.close());
  return () => composed.handler({}, localLambdaContext('reclaimer', 900));
}

describe('the provisioner token from an SSM SecureString', () => {
  it('is read once at cold start, with decryption, sent on the listing, and kept for the next invocations', async () => {
    const run = await coldReclaimer();
    expect(ssm.requests).toEqual([{ name: PARAMETER, withDecryption: true, signedFor: 'ssm' }]);

    for (let invocation = 0; invocation < 2; invocation += 1) {
      expect(await run()).toMatchObject({ listed: 0 });
    }

    expect(ssm.requests).toHaveLength(1);
    expect(provisioner.requests.map(({ method, bearer }) => `${method} ${bearer}`)).toEqual([
      `GET ${FIRST}`,
      `GET ${FIRST}`,
    ]);
  });

  it('is read again after a 401 from a rotated provisioner, and the listing goes on with the new one', async () => {
    const run = await coldReclaimer();
    accepted = SECOND;
    ssm.put(PARAMETER, { type: 'SecureString', value: SECOND });

    expect(await run()).toMatchObject({ listed: 0 });

    expect(ssm.requests).toHaveLength(2);
    expect(provisioner.requests.map(({ bearer }) => bearer)).toEqual([FIRST, SECOND]);
  });

  it('left unrotated while the provisioner moved on: the run is refused, after one more read', async () => {
    const run = await coldReclaimer();
    accepted = SECOND;

    let result: unknown;
    const output = await captureOutput(async () => {
      result = await run();
    });

    expect(result).toMatchObject({ refused: 'list_unavailable' });
    expect(output).toContain('PROVISIONER_AUTH_FAILED');
    expect(output).not.toContain(FIRST);

    expect(ssm.requests).toHaveLength(2);
    expect(provisioner.requests).toHaveLength(1);
  });

  it('is read again once for every 401 that arrives together', async () => {
    const source = provisionerTokenSource(loadConfig(lambdaEnv()), () => createSsmClient())!;
    const client = new ProvisionerClient(provisioner.url, {
      token: { origin: source.origin, value: await source.current(), reread: () => source.reread() },
    });
    onTestFinished(() => client.close());
    accepted = SECOND;
    ssm.put(PARAMETER, { type: 'SecureString', value: SECOND });

    const outcomes = await Promise.all(
      ['a', 'b', 'c', 'd'].map((id) =>
        client.deleteSandbox({ sandboxId: `sbx-${id}`, generation: 1, deleteTimeoutMs: 5_000 }),
      ),
    );

    expect(outcomes).toEqual(Array(4).fill(ReleaseOutcome.ABSENT));
    expect(ssm.requests).toHaveLength(2);
  });

  it("is read by the release function's cold start too", async () => {
    const composed = await composeRelease(infrastructure());
    onTestFinished(() => composed.close());
    expect(ssm.requests).toEqual([{ name: PARAMETER, withDecryption: true, signedFor: 'ssm' }]);
  });

  it.each([
    [
      'of type String',
      { type: 'String', value: FIRST } as const,
      /it is of type String; store the token as a SecureString/,
    ],
    [
      'holding no bearer token',
      { type: 'SecureString', value: `${FIRST} trailing words` } as const,
      /its value must be a token of RFC 6750's form .*value not shown/,
    ],
  ])(
    '%s: the cold start fails with PROVISIONER_TOKEN_UNREADABLE, naming the parameter, never the value',
    async (_name, parameter, why) => {
      ssm.put(PARAMETER, parameter);

      const error = await rejectionOf(composeReclaimer(deployedInfrastructure(lambdaEnv())));

      expect(error).toMatchObject({
        code: InfrastructureErrorCode.PROVISIONER_TOKEN_UNREADABLE,
        retryable: true,
      });
      expect((error as Error).message).toContain(
        `cannot read SANDBOX_PROVISIONER_TOKEN from SSM parameter ${PARAMETER}`,
      );
      expect((error as Error).message).toMatch(why);
      expect((error as Error).message).not.toContain(FIRST);
    },
  );
});
