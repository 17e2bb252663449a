/**
 * A stage's settings and the rules of each param (infra/serverless/stage.cjs), on the function that
 * decides them. That osls reaches it and refuses to package with its message is proven once per
 * kind of refusal through the real `npm run package` (test/integration/template-stage-settings.test.ts:
 * an unknown name, a param's rule); each further rule costs an osls start there and proves no more
 * wiring, so the rules are held here.
 */
import { createRequire } from 'node:module';
import { beforeAll, describe, expect, it } from 'vitest';

interface StageModule {
  settingsOf: (stage: string, params: Record<string, unknown>) => Record<string, unknown>;
  assertKnownNames: (
    configured: Record<string, Record<string, unknown>> | null,
    cliParams?: string[],
  ) => void;
}

const require = createRequire(import.meta.url);
const { settingsOf, assertKnownNames } = require('../../infra/serverless/stage.cjs') as StageModule;
const { loadProjectFacts } = require('../../infra/serverless/project.cjs') as {
  loadProjectFacts: () => Promise<unknown>;
};

const SUBNET = 'subnet-0123456789abcdef0';
const SECURITY_GROUP = 'sg-0123456789abcdef0';

beforeAll(async () => {
  // What resources.cjs awaits before osls asks for any setting: config.ts's defaults and rules.
  await loadProjectFacts();
});

describe('settingsOf: a param that breaks its rule is refused, naming the param, its value and the rule', () => {
  it.each([
    [
      'a database driver that does not exist',
      { DATABASE_DRIVER: 'mysql' },
      'param DATABASE_DRIVER="mysql" is invalid: must be neon or tcp, or empty',
    ],
    [
      'a log level Powertools does not know',
      { LOG_LEVEL: 'LOUD' },
      'param LOG_LEVEL="LOUD" is invalid: must be TRACE or DEBUG',
    ],
    [
      'an architecture Lambda does not run',
      { architecture: 'ppc64' },
      'param architecture="ppc64" is invalid: must be arm64 or x86_64',
    ],
    [
      'a subnet id that is not one',
      { vpcSubnetIds: 'subnet-12' },
      'param vpcSubnetIds="subnet-12" is invalid: subnet-12 is not a subnet id',
    ],
    [
      'subnets without security groups',
      { vpcSubnetIds: SUBNET },
      'param vpcSecurityGroupIds="" is invalid: must name the security groups too: vpcSubnetIds is set',
    ],
    [
      'security groups without subnets',
      { vpcSecurityGroupIds: SECURITY_GROUP },
      'param vpcSubnetIds="" is invalid: must name the subnets too: vpcSecurityGroupIds is set',
    ],
    [
      'a token switch that is not a boolean',
      { provisionerToken: 'yes' },
      'param provisionerToken="yes" is invalid: must be true or false',
    ],
    [
      'an endpoint that is not an http(s) URL',
      { awsEndpointUrl: 'ftp://localstack:4566' },
      'param awsEndpointUrl="ftp://localstack:4566" is invalid: must be an http:// or https:// URL, or empty',
    ],
    [
      'a bad configuration value',
      { FENCE_SWEEP_AFTER_SECONDS: 'soon' },
      'FENCE_SWEEP_AFTER_SECONDS="soon" is invalid: must be a positive integer',
    ],
  ])('%s', (_what, params, message) => {
    expect(() => settingsOf('ci', params)).toThrow(message);
  });
});

describe('settingsOf: what a stage gets', () => {
  it('takes the defaults where nothing is set: INFO, arm64, no private network, no token, no driver', () => {
    expect(settingsOf('ci', {})).toMatchObject({
      stage: 'ci',
      logLevel: 'INFO',
      databaseDriver: undefined,
      architecture: 'arm64',
      privateNetwork: undefined,
      provisionerToken: false,
      awsEndpointUrl: undefined,
      alarmSubscription: '',
    });
  });

  it('reads what is set: a list or a comma-separated string of ids, the switch, the endpoint’s origin', () => {
    expect(
      settingsOf('ci', {
        LOG_LEVEL: 'DEBUG',
        DATABASE_DRIVER: 'tcp',
        architecture: 'x86_64',
        vpcSubnetIds: `${SUBNET}, subnet-0fedcba9876543210`,
        vpcSecurityGroupIds: [SECURITY_GROUP],
        provisionerToken: 'true',
        awsEndpointUrl: 'http://localhost:4566/',
        FENCE_SWEEP_AFTER_SECONDS: '20',
      }),
    ).toMatchObject({
      logLevel: 'DEBUG',
      databaseDriver: 'tcp',
      architecture: 'x86_64',
      privateNetwork: { subnetIds: [SUBNET, 'subnet-0fedcba9876543210'], securityGroupIds: [SECURITY_GROUP] },
      provisionerToken: true,
      awsEndpointUrl: 'http://localhost:4566',
      config: expect.objectContaining({ FENCE_SWEEP_AFTER_SECONDS: 20 }),
    });
  });
});

describe('assertKnownNames', () => {
  it('refuses a misspelt name on the command line or in any stage’s block, naming each', () => {
    expect(() => assertKnownNames({}, ['FENCE_SWEEP_AFTER_SECOND=20'])).toThrow(
      'unknown name(s) --param="FENCE_SWEEP_AFTER_SECOND=20"',
    );
    expect(() => assertKnownNames({ prod: { archtecture: 'arm64' } }, [])).toThrow(
      'unknown name(s) params.prod.archtecture',
    );
  });

  it('lets every name a stage may set through', () => {
    expect(() =>
      assertKnownNames({ default: { LOG_LEVEL: 'INFO', architecture: 'arm64' } }, ['DATABASE_DRIVER=tcp']),
    ).not.toThrow();
  });
});
