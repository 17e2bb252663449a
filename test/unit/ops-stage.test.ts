/**
 * `ops --stage NAME` stands for the names serverless.yml gives that stage's resources, and gives
 * way to what the environment sets. The names are checked against serverless.yml itself, so a
 * change of the prefix or of the parameter's path there cannot leave the CLI looking elsewhere.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { createOpsContext } from '../../infra/ops/context.ts';
import { UsageError } from '../../infra/ops/errors.ts';
import { stageNamed, stageOverrides, withStageDefaults } from '../../infra/ops/stage.ts';
import { REPO_ROOT } from '../support/docs.ts';

const serverless = parse(readFileSync(join(REPO_ROOT, 'serverless.yml'), 'utf8')) as {
  custom: { queueNamePrefix: string; ssmParameters: { databaseUrl: string } };
};
/** serverless.yml's `${sls:stage}`, the variable osls resolves to the stage's name. */
const STAGE_VARIABLE = ['$', '{sls:stage}'].join('');
const forStage = (template: string, stage: string) => template.replaceAll(STAGE_VARIABLE, stage);

describe('ops --stage', () => {
  it("names serverless.yml's queue prefix and database URL parameter of the stage", () => {
    for (const name of ['prod', 'dev', 'eu-2']) {
      expect(stageNamed(name)).toEqual({
        name,
        queueNamePrefix: forStage(serverless.custom.queueNamePrefix, name),
        databaseUrlParameter: forStage(serverless.custom.ssmParameters.databaseUrl, name),
      });
    }
  });

  it('refuses a name no stage can have, as a usage error', () => {
    for (const name of ['', 'prod/../dev', 'two words', 'x'.repeat(33)]) {
      expect(() => stageNamed(name), name).toThrow(UsageError);
    }
  });

  it('fills in only what the environment leaves unset', () => {
    const prod = stageNamed('prod');
    expect(withStageDefaults({}, prod)).toMatchObject({
      QUEUE_NAME_PREFIX: 'prod-',
      DATABASE_URL_PARAMETER: '/runtime-cleanup/prod/database-url',
    });
    // An empty prefix is a prefix (the base names); a given URL means SSM is not asked.
    const given = withStageDefaults({ QUEUE_NAME_PREFIX: '', DATABASE_URL: 'postgres://h/db' }, prod);
    expect(given).toMatchObject({ QUEUE_NAME_PREFIX: '', DATABASE_URL: 'postgres://h/db' });
    expect(given.DATABASE_URL_PARAMETER).toBeUndefined();
    expect(withStageDefaults({ DATABASE_URL_PARAMETER: '/elsewhere/url' }, prod).DATABASE_URL_PARAMETER).toBe(
      '/elsewhere/url',
    );
  });

  it('builds a context that reads the URL only when a command needs the database', () => {
    const context = createOpsContext({}, { stage: 'prod' });
    expect(context.config.queueNamePrefix).toBe('prod-');
    expect(context.config.databaseUrlParameter).toBe('/runtime-cleanup/prod/database-url');
    expect(context.describe.database).toBe('(in SSM parameter /runtime-cleanup/prod/database-url, not read)');
    // Without --stage a lone parameter is still refused: the command reads no SSM unless told to.
    expect(() => createOpsContext({ DATABASE_URL_PARAMETER: '/runtime-cleanup/prod/database-url' })).toThrow(
      /this command does not read DATABASE_URL_PARAMETER/,
    );
  });

  it('names every exported variable that overrides the stage, with the password hidden, and nothing else', () => {
    const prod = stageNamed('prod');
    expect(stageOverrides({}, prod)).toEqual([]);
    // What the stage would have used anyway is no override.
    expect(
      stageOverrides({ QUEUE_NAME_PREFIX: 'prod-', DATABASE_URL_PARAMETER: prod.databaseUrlParameter }, prod),
    ).toEqual([]);
    const lines = stageOverrides(
      { DATABASE_URL: 'postgres://ops:hunter2@db.staging.internal/app', QUEUE_NAME_PREFIX: 'staging-' },
      prod,
    );
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(
      /^--stage prod: DATABASE_URL \(postgres:\/\/ops:.*@db\.staging\.internal\/app\) from the environment/,
    );
    expect(lines.join('\n')).not.toContain('hunter2');
    expect(lines[1]).toContain(
      'QUEUE_NAME_PREFIX ("staging-") from the environment is used instead of the queue prefix prod-',
    );
    expect(stageOverrides({ DATABASE_URL_PARAMETER: '/other/database-url' }, prod)).toEqual([
      "--stage prod: DATABASE_URL_PARAMETER (/other/database-url) from the environment is used instead of SSM /runtime-cleanup/prod/database-url; unset it to use the stage's",
    ]);
  });
});
