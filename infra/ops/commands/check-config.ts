/**
 * `check-config`: validates the configuration exactly as the functions do at cold start
 * (loadConfig, already run when the context was built: a bad value never gets here) and then the
 * timeout ladder that keeps a release from outliving what waits for it:
 *
 *   lock wait + delete timeout < cleanup timeout < release function timeout
 *   queue visibility timeout ≥ 6 × its consumer's function timeout (AWS's guidance for Lambda
 *   event sources: otherwise a message in a slow, retried invocation is delivered twice)
 *
 * and the connection budget: every function's concurrency × database pool size, summed, must stay
 * within DATABASE_MAX_CONNECTIONS (the same rule `npm run package` refuses to break).
 *
 * A broken rung or budget ends with the same one-line ConfigError and exit code 2.
 */
import {
  type CleanupConfig,
  type CONFIG_DEFAULTS,
  DATABASE_FAILURE_REPORT_MARGIN_MS,
  redactUrl,
  validProvisionerUrl,
} from '../../../functions/adapters/config.ts';
import {
  type BudgetLine,
  connectionBudget,
  connectionBudgetError,
} from '../../../functions/adapters/connection-budget.ts';
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
  /** `stage`: filled in by `--stage` (stage.ts), the environment having left it unset. */
  source: 'environment' | 'stage' | 'default';
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
  // A hung database fails a record within connect + query timeout; the consumer then still needs
  // the margin to report it, before the shortest consumer's Lambda deadline.
  const databaseBound =
    (config.databaseConnectTimeoutMs + config.databaseQueryTimeoutMs + DATABASE_FAILURE_REPORT_MARGIN_MS) /
    1000;
  const shortestConsumer = Math.min(
    ...Object.values(QUEUE_DEFINITIONS)
      .filter((definition) => definition.consumer)
      .map(
        (definition) =>
          FUNCTION_DEFINITIONS[definition.consumer as keyof typeof FUNCTION_DEFINITIONS].timeoutSeconds,
      ),
  );
  checks.push({
    rule: `database connect + query timeout + ${DATABASE_FAILURE_REPORT_MARGIN_MS / 1000} s ≤ shortest consumer function timeout`,
    left: databaseBound,
    right: shortestConsumer,
    holds: databaseBound <= shortestConsumer,
    failure: () =>
      new ConfigError(
        'DATABASE_QUERY_TIMEOUT_MS',
        String(config.databaseQueryTimeoutMs),
        `with DATABASE_CONNECT_TIMEOUT_MS (${config.databaseConnectTimeoutMs}) and a ${DATABASE_FAILURE_REPORT_MARGIN_MS} ms margin must fit the shortest consumer function timeout (${shortestConsumer} s, infra/queues.json)`,
      ),
  });
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

function databaseUrlValue(config: CleanupConfig): string {
  if (config.databaseUrl) return redactUrl(config.databaseUrl);
  // check-config connects nowhere, SSM included: the parameter is named, not read.
  if (config.databaseUrlParameter) return `(from DATABASE_URL_PARAMETER, read when a command needs it)`;
  return redactUrl(DEFAULT_DATABASE_URL);
}

function settings(env: Env, configEnv: Env, config: CleanupConfig): Setting[] {
  const setIn = (from: Env, name: string) => from[name] !== undefined && from[name]!.trim() !== '';
  const source = (name: string): Setting['source'] =>
    setIn(env, name) ? 'environment' : setIn(configEnv, name) ? 'stage' : 'default';
  const given = (name: string) => setIn(env, name);
  const list: Setting[] = [
    {
      variable: 'DATABASE_URL',
      value: databaseUrlValue(config),
      // Read from the parameter: from wherever the parameter's name came.
      source: config.databaseUrl ? source('DATABASE_URL') : source('DATABASE_URL_PARAMETER'),
    },
    {
      variable: 'DATABASE_URL_PARAMETER',
      value: config.databaseUrlParameter ?? '(unset: DATABASE_URL is used as given)',
      source: source('DATABASE_URL_PARAMETER'),
    },
    {
      variable: 'AWS_ENDPOINT_URL_SQS',
      value: config.sqsEndpoint ? redactUrl(config.sqsEndpoint) : '(unset: AWS, SDK default endpoint)',
      source: given('AWS_ENDPOINT_URL_SQS') ? 'environment' : 'default',
    },
    {
      variable: 'QUEUE_NAME_PREFIX',
      value: config.queueNamePrefix || '(none)',
      source: source('QUEUE_NAME_PREFIX'),
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
    RECLAIM_INTERVAL_SECONDS: config.reclaimIntervalSeconds,
    RECLAIM_GRACE_SECONDS: config.reclaimGraceSeconds,
    RECLAIM_MAX_PER_RUN: config.reclaimMaxPerRun,
    RECLAIM_MAX_SHARE_PERCENT: config.reclaimMaxSharePercent,
    DATABASE_LOCK_TIMEOUT_MS: config.databaseLockTimeoutMs,
    DATABASE_STATEMENT_TIMEOUT_MS: config.databaseStatementTimeoutMs,
    DATABASE_CONNECT_TIMEOUT_MS: config.databaseConnectTimeoutMs,
    DATABASE_QUERY_TIMEOUT_MS: config.databaseQueryTimeoutMs,
    DATABASE_MAX_CONNECTIONS: config.databaseMaxConnections,
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
    // Validated here although loadConfig leaves it to the release function (see config.ts).
    validProvisionerUrl(context.config);
    const checks = ladder(context.config);
    const broken = checks.find((check) => !check.holds);
    if (broken) throw broken.failure();
    const budget = connectionBudget(context.config.databaseMaxConnections);
    if (!budget.fits) throw connectionBudgetError(budget);
    const ladderResult: LadderCheck[] = checks.map(({ rule, holds, left, right }) => ({
      rule,
      holds,
      left,
      right,
    }));
    const settingsResult = settings(context.env, context.configEnv, context.config);
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
      `Database connections: ${budget.total} at most, within DATABASE_MAX_CONNECTIONS ${budget.max}`,
      '',
      renderTable(
        ['FUNCTION', 'CONCURRENCY', 'POOL', 'CONNECTIONS'],
        budget.lines.map((line: BudgetLine) => [
          line.functionKey,
          `${line.concurrency} (${line.bound})`,
          String(line.poolSize),
          String(line.connections),
        ]),
      ),
      '',
      renderTable(
        ['VARIABLE', 'VALUE', 'FROM'],
        settingsResult.map((setting) => [setting.variable, setting.value, setting.source]),
      ),
    ].join('\n');
    return {
      result: {
        valid: true,
        ladder: ladderResult,
        connectionBudget: { lines: budget.lines, total: budget.total, max: budget.max },
        settings: settingsResult,
      },
      text,
    };
  },
};
