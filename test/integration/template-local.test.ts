/**
 * The local stage (LocalStack, docs/localstack.md), packaged offline like any stage: the same
 * functions, mappings, queues, roles and alarms as dev, with only the settings LocalStack needs
 * (an architecture its Lambda runs, the TCP database driver, LocalStack's address for SQS and
 * SSM); and its deployment plugin (infra/localstack/osls-plugin.cjs) active for it alone: dev and
 * prod package byte for byte as they do from a serverless.yml that has no local stage at all.
 * Deploying needs LocalStack and Docker, which cannot run here (test/e2e/localstack-commands.test.ts
 * covers what can be run without them).
 */
import { readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseDocument } from 'yaml';
import { LOCALSTACK } from '../../infra/localstack/topology.ts';
import { FUNCTION_KEYS, type FunctionKey } from '../support/lambda-task.ts';
import {
  type CfnTemplate,
  comparableTemplate,
  differingArtifacts,
  type PackagedService,
  PRODUCTION_PACKAGING,
  PROJECT_ROOT,
  packageProduction,
  packageService,
  packagingWorkDir,
} from '../support/packaged-template.ts';
import { TemplateQueries } from '../support/template-queries.ts';

/** What the local stage's plugin says at every command; no other stage's output has it. */
const PLUGIN_LINE = 'deploys of this stage go to LocalStack at';

/** serverless.yml without any trace of the local stage: its plugin and its params. */
const BASELINE_CONFIG = `.serverless-baseline-${process.pid}.yml`;

let workDir: string;
let home: string;
const packaged = new Map<string, PackagedService>();

async function writeBaselineConfig(): Promise<void> {
  const document = parseDocument(await readFile(join(PROJECT_ROOT, 'serverless.yml'), 'utf8'));
  document.set('plugins', ['serverless-esbuild']);
  document.deleteIn(['params', 'local']);
  await writeFile(join(PROJECT_ROOT, BASELINE_CONFIG), document.toString());
}

beforeAll(async () => {
  ({ workDir, home } = await packagingWorkDir('local-stage'));
  await writeBaselineConfig();
  for (const [name, stage, args] of [
    ['local', 'local', []],
    ['dev', 'dev', []],
    ['dev-baseline', 'dev', ['--config', BASELINE_CONFIG]],
    // prod's baseline with the production options: prod itself is template-production.test.ts's.
    [
      'prod-baseline',
      PRODUCTION_PACKAGING.stage,
      [...PRODUCTION_PACKAGING.args, '--config', BASELINE_CONFIG],
    ],
  ] as const) {
    packaged.set(
      name,
      await packageService({ stage, outputDir: join(workDir, name), home, args: [...args] }),
    );
  }
  packaged.set('prod', await packageProduction({ outputDir: join(workDir, 'prod'), home }));
}, 400_000);

afterAll(async () => {
  await rm(join(PROJECT_ROOT, BASELINE_CONFIG), { force: true });
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

const get = (name: string) => packaged.get(name)!;
const queries = (template: CfnTemplate, stage: string) =>
  new TemplateQueries<FunctionKey>(template, {
    service: 'runtime-cleanup',
    stage,
    functionKeys: FUNCTION_KEYS,
  });

/**
 * A template with the stage's name taken out, and without the two function properties a stage's
 * params may change (its architecture and environment, compared on their own below).
 */
function stageless(template: CfnTemplate, stage: string): string {
  const copy = JSON.parse(JSON.stringify(template)) as CfnTemplate;
  for (const resource of Object.values(copy.Resources)) {
    if (resource.Type !== 'AWS::Lambda::Function') continue;
    delete resource.Properties!.Architectures;
    delete resource.Properties!.Environment;
  }
  return comparableTemplate(copy).replace(new RegExp(`\\b${stage}\\b`, 'g'), '<stage>');
}

describe('the local stage’s plugin', () => {
  it.each(['dev', 'prod'])(
    'leaves %s as it packages without a local stage: same template, same zips',
    async (stage) => {
      const current = get(stage);
      const baseline = get(`${stage}-baseline`);
      expect(comparableTemplate(current.template)).toBe(comparableTemplate(baseline.template));
      expect(await differingArtifacts(current, baseline)).toEqual([]);
      expect(current.output).not.toContain(PLUGIN_LINE);
    },
  );

  it('is active for the local stage, and says where its deploys go', () => {
    expect(get('local').output).toContain(`${PLUGIN_LINE} ${LOCALSTACK.hostEndpoint}`);
  });
});

describe('the local stage’s template', () => {
  it('has the same functions, mappings, queues, roles, alarms and dashboard as dev, and nothing else', () => {
    expect(stageless(get('local').template, 'local')).toBe(stageless(get('dev').template, 'dev'));
    // The comparison sees them all: the template is not empty of what it claims.
    const local = queries(get('local').template, 'local');
    expect(
      local
        .eventSourceMappings()
        .map(({ functionKey, queue }) => `${functionKey}←${queue}`)
        .sort(),
    ).toEqual(['fenceCheck←run-finished', 'finalize←runtime-finalize', 'release←runtime-release.fifo']);
    expect(local.alarms().length).toBeGreaterThanOrEqual(6);
  });

  it('runs on an architecture LocalStack’s Lambda runs on every host (dev and prod stay on arm64)', () => {
    for (const key of FUNCTION_KEYS) {
      expect(
        queries(get('local').template, 'local').lambdaFunction(key).properties.Architectures,
        key,
      ).toEqual(['x86_64']);
      expect(queries(get('dev').template, 'dev').lambdaFunction(key).properties.Architectures, key).toEqual([
        'arm64',
      ]);
    }
  });

  it('gives every function the TCP driver and LocalStack’s address for SQS and SSM, and otherwise dev’s environment', () => {
    const local = queries(get('local').template, 'local');
    const dev = queries(get('dev').template, 'dev');
    for (const key of FUNCTION_KEYS) {
      const expected = Object.fromEntries(
        Object.entries(dev.environmentOf(key)).map(([name, value]) => [
          name,
          value.replace(/\bdev\b/g, 'local'),
        ]),
      );
      expect(local.environmentOf(key), key).toEqual({
        ...expected,
        DATABASE_DRIVER: 'tcp',
        AWS_ENDPOINT_URL_SQS: LOCALSTACK.lambdaEndpoint,
        AWS_ENDPOINT_URL_SSM: LOCALSTACK.lambdaEndpoint,
      });
      expect(dev.environmentOf(key), key).not.toHaveProperty('AWS_ENDPOINT_URL_SQS');
    }
    expect(local.environmentOf('fenceCheck').DATABASE_URL_PARAMETER).toBe(
      '/runtime-cleanup/local/database-url',
    );
    expect(local.environmentOf('release').SANDBOX_PROVISIONER_URL).toBe(
      '{{resolve:ssm:/runtime-cleanup/local/sandbox-provisioner-url}}',
    );
  });
});
