/**
 * `--stage NAME`: the names serverless.yml gives a deployed stage's resources, so that an operator
 * names the stage instead of exporting its queue prefix and its password-bearing database URL:
 *
 *   queues        `<stage>-<base name>`           (custom.queueNamePrefix: ${sls:stage}-)
 *   database URL  `/runtime-cleanup/<stage>/database-url`, an SSM SecureString
 *                                                 (custom.ssmParameters.databaseUrl)
 *
 * The stage only fills in what the environment leaves unset: an exported QUEUE_NAME_PREFIX,
 * DATABASE_URL or DATABASE_URL_PARAMETER wins, as with `npm run smoke -- --stage` (a tunnel to the
 * stage's database, a queue prefix of one's own). test/unit/ops-stage.test.ts checks these names
 * against serverless.yml.
 */
import { redactConnectionString } from '../../functions/adapters/redact.ts';
import type { Env } from './context.ts';
import { UsageError } from './errors.ts';

/** What CloudFormation and SQS accept in the names built from it; the smoke check's rule too. */
const STAGE_NAME = /^[a-zA-Z0-9-]{1,32}$/;

export interface Stage {
  name: string;
  queueNamePrefix: string;
  databaseUrlParameter: string;
}

export function stageNamed(name: string): Stage {
  if (!STAGE_NAME.test(name)) {
    throw new UsageError(
      `--stage ${JSON.stringify(name)} is not a stage name (letters, digits and -, at most 32)`,
    );
  }
  return {
    name,
    queueNamePrefix: `${name}-`,
    databaseUrlParameter: `/runtime-cleanup/${name}/database-url`,
  };
}

/** Set to something other than blanks (QUEUE_NAME_PREFIX's empty value is checked apart). */
function isGiven(env: Env, name: string): boolean {
  return env[name] !== undefined && env[name]!.trim() !== '';
}

/**
 * The environment as the configuration reads it under `--stage`. QUEUE_NAME_PREFIX set to empty
 * counts as set (the base names, as for `npm run stack`); DATABASE_URL_PARAMETER is left unset
 * when DATABASE_URL is given, which then is used as it is and SSM is never asked.
 */
export function withStageDefaults(env: Env, stage: Stage): Env {
  const given = (name: string) => isGiven(env, name);
  return {
    ...env,
    QUEUE_NAME_PREFIX: env.QUEUE_NAME_PREFIX ?? stage.queueNamePrefix,
    DATABASE_URL_PARAMETER:
      given('DATABASE_URL_PARAMETER') || given('DATABASE_URL')
        ? env.DATABASE_URL_PARAMETER
        : stage.databaseUrlParameter,
  };
}

/**
 * One line per exported variable that overrides what `--stage` names, for stderr before the
 * command runs. The environment wins (see withStageDefaults), and an on-call shell often still
 * holds the last incident's DATABASE_URL or QUEUE_NAME_PREFIX: without a word, `--stage prod
 * fences` would answer "No pending fences." about another stage's database and exit 0. The URL is
 * shown with its password hidden.
 */
export function stageOverrides(env: Env, stage: Stage): string[] {
  const given = (name: string) => isGiven(env, name);
  const lines: string[] = [];
  const overriding = (what: string, instead: string) =>
    `--stage ${stage.name}: ${what} from the environment is used instead of ${instead}; unset it to use the stage's`;
  if (given('DATABASE_URL')) {
    lines.push(
      overriding(
        `DATABASE_URL (${redactConnectionString(env.DATABASE_URL!)})`,
        `SSM ${stage.databaseUrlParameter}`,
      ),
    );
  } else if (given('DATABASE_URL_PARAMETER') && env.DATABASE_URL_PARAMETER !== stage.databaseUrlParameter) {
    lines.push(
      overriding(
        `DATABASE_URL_PARAMETER (${env.DATABASE_URL_PARAMETER})`,
        `SSM ${stage.databaseUrlParameter}`,
      ),
    );
  }
  if (env.QUEUE_NAME_PREFIX !== undefined && env.QUEUE_NAME_PREFIX !== stage.queueNamePrefix) {
    lines.push(
      overriding(
        `QUEUE_NAME_PREFIX (${JSON.stringify(env.QUEUE_NAME_PREFIX)})`,
        `the queue prefix ${stage.queueNamePrefix}`,
      ),
    );
  }
  return lines;
}
