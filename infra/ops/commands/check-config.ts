/**
 * `check-config`: validates the configuration exactly as the functions do at cold start
 * (loadConfig, already run when the context was built: a bad value never gets here) and then the
 * timeout ladder that keeps a release from outliving what waits for it:
 *
 *   lock wait + delete timeout < cleanup timeout < release function timeout
 *   queue visibility timeout ≥ 6 × its consumer's function timeout (AWS's guidance for Lambda
 *   event sources: otherwise a message in a slow, retried invocation is delivered twice)
 *
 * A broken rung ends with the same one-line ConfigError and exit code 2.
 */
import { type CleanupConfig, type CONFIG_DEFAULTS, redactUrl } from '../../../functions/adapters/config.ts';
import { ConfigError } from '../../../functions/adapters/errors.ts';
import { FUNCTION_DEFINITIONS, QUEUE_DEFINITIONS } from '../../../functions/adapters/queues.ts';
import type { Command } from '../command.ts';
import { DEFAULT_DATABASE_URL, type Env } from '../context.ts';
import { renderTable } from '../format.ts';

const VISIBILITY_FACTOR = 6;

export interface LadderCheck {
  rule: string;
  holds: boolean;
  /** The numbers compared, in seconds. */
  left: number;
  right: number;
}

export interface Setting {
  variable: string;
  value: string;
  source: 'environment' | 'default';
}

function ladder(config: CleanupConfig): Array<LadderCheck & { failure: () => ConfigError }> {
  const lockAndDelete = config.releaseLockTimeoutSeconds + config.provisionerDeleteTimeoutSeconds;
  const releaseFunction = FUNCTION_DEFINITIONS.release.timeoutSeconds;
  const checks: Array<LadderCheck & { failure: () => ConfigError }> = [
    {
      rule: 'lock wait + delete timeout < cleanup timeout',
      left: lockAndDelete,
      right: config.runtimeCleanupTimeoutSeconds,
      holds: lockAndDelete < config.runtimeCleanupTimeoutSeconds,
      failure: () =>
        new ConfigError(
          'SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS',
          String(config.runtimeCleanupTimeoutSeconds),
          `must be greater than lock wait + delete timeout (${lockAndDelete})`,
        ),
    },
    {
      rule: 'cleanup timeout < release function timeout',
      left: config.runtimeCleanupTimeoutSeconds,
      right: releaseFunction,
      holds: config.runtimeCleanupTimeoutSeconds < releaseFunction,
      failure: () =>
        new ConfigError(
          'SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS',
          String(config.runtimeCleanupTimeoutSeconds),
          `must be less than the release function timeout (${releaseFunction} s, infra/queues.json functions.release.timeoutSeconds)`,
        ),
    },
  ];
  for (const [queue, definition] of Object.entries(QUEUE_DEFINITIONS)) {
    if (!definition.consumer) continue;
    const functionTimeout =
      FUNCTION_DEFINITIONS[definition.consumer as keyof typeof FUNCTION_DEFINITIONS].timeoutSeconds;
    const minimum = VISIBILITY_FACTOR * functionTimeout;
    checks.push({
      rule: `${queue} visibility ≥ ${VISIBILITY_FACTOR} × ${definition.consumer} function timeout`,
      left: definition.visibilityTimeoutSeconds,
      right: minimum,
      holds: definition.visibilityTimeoutSeconds >= minimum,
      failure: () =>
        new ConfigError(
          `infra/queues.json queues.${queue}.visibilityTimeoutSeconds`,
          String(definition.visibilityTimeoutSeconds),
          `must be at least ${VISIBILITY_FACTOR} × the ${definition.consumer} function timeout (${minimum})`,
        ),
    });
  }
  return checks;
}

function settings(env: Env, config: CleanupConfig): Setting[] {
  const given = (name: string) => env[name] !== undefined && env[name]!.trim() !== '';
  const list: Setting[] = [
    {
      variable: 'DATABASE_URL',
      value: redactUrl(config.databaseUrl ?? DEFAULT_DATABASE_URL),
      source: given('DATABASE_URL') ? 'environment' : 'default',
    },
    {
      variable: 'AWS_ENDPOINT_URL_SQS',
      value: config.sqsEndpoint ? redactUrl(config.sqsEndpoint) : '(unset: AWS, SDK default endpoint)',
      source: given('AWS_ENDPOINT_URL_SQS') ? 'environment' : 'default',
    },
    {
      variable: 'QUEUE_NAME_PREFIX',
      value: config.queueNamePrefix || '(none)',
      source: given('QUEUE_NAME_PREFIX') ? 'environment' : 'default',
    },
    {
      variable: 'SANDBOX_PROVISIONER_URL',
      value: config.provisionerUrl
        ? redactUrl(config.provisionerUrl)
        : '(unset: the built-in local provisioner)',
      source: given('SANDBOX_PROVISIONER_URL') ? 'environment' : 'default',
    },
  ];
  const numbers: Record<keyof typeof CONFIG_DEFAULTS, number> = {
    SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: config.releaseLockTimeoutSeconds,
    SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: config.provisionerDeleteTimeoutSeconds,
    SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: config.runtimeCleanupTimeoutSeconds,
    CLEANUP_RETRY_BASE_SECONDS: config.retryBaseSeconds,
    CLEANUP_RETRY_MAX_SECONDS: config.retryMaxSeconds,
    FENCE_SWEEP_AFTER_SECONDS: config.fenceSweepAfterSeconds,
    FENCE_SWEEP_INTERVAL_SECONDS: config.fenceSweepIntervalSeconds,
    DATABASE_LOCK_TIMEOUT_MS: config.databaseLockTimeoutMs,
    DATABASE_STATEMENT_TIMEOUT_MS: config.databaseStatementTimeoutMs,
  };
  for (const [variable, value] of Object.entries(numbers)) {
    list.push({ variable, value: String(value), source: given(variable) ? 'environment' : 'default' });
  }
  return list;
}

export const checkConfigCommand: Command = {
  name: 'check-config',
  arguments: [],
  summary: 'validate the configuration and print the timeout ladder (no connections)',
  options: {},
  async run(_input, context) {
    const checks = ladder(context.config);
    const broken = checks.find((check) => !check.holds);
    if (broken) throw broken.failure();
    const ladderResult: LadderCheck[] = checks.map(({ rule, holds, left, right }) => ({
      rule,
      holds,
      left,
      right,
    }));
    const settingsResult = settings(context.env, context.config);
    const c = context.config;
    const text = [
      'Configuration is valid.',
      '',
      'Timeout ladder (seconds)',
      `  lock wait ${c.releaseLockTimeoutSeconds} + delete timeout ${c.provisionerDeleteTimeoutSeconds} = ${
        c.releaseLockTimeoutSeconds + c.provisionerDeleteTimeoutSeconds
      }  <  cleanup timeout ${c.runtimeCleanupTimeoutSeconds}  <  release function timeout ${FUNCTION_DEFINITIONS.release.timeoutSeconds}`,
      '',
      renderTable(
        ['CHECK', 'VALUES', 'OK'],
        ladderResult.map((check) => [
          check.rule,
          `${check.left} vs ${check.right}`,
          check.holds ? 'yes' : 'NO',
        ]),
      ),
      '',
      renderTable(
        ['VARIABLE', 'VALUE', 'FROM'],
        settingsResult.map((setting) => [setting.variable, setting.value, setting.source]),
      ),
    ].join('\n');
    return { result: { valid: true, ladder: ladderResult, settings: settingsResult }, text };
  },
};
