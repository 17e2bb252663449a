'use strict';

/**
 * The facts the deployment is generated from, read from the project's own single sources rather
 * than copied: queue and function settings from `infra/queues.json` (through queues.ts, which
 * also owns the DLQ naming rule), metric names from `functions/adapters/metric-names.ts`,
 * configuration defaults and rules from `functions/adapters/config.ts`. A copy would drift; a
 * renamed metric would then leave an alarm watching nothing, silently green forever.
 *
 * osls loads these files with `require`; the TypeScript modules are ESM (some dependencies are
 * ESM-only), so they are imported through tsx's ESM API (a devDependency; only packaging needs
 * it). Node's own type stripping cannot load them: errors.ts uses constructor parameter
 * properties, which strip-only mode rejects.
 */
const path = require('node:path');
const { tsImport } = require('tsx/esm/api');

const ROOT = path.resolve(__dirname, '..', '..');

/** @param {string} relative a module path from the project root */
function load(relative) {
  return tsImport(path.join(ROOT, relative), __filename);
}

/** AWS's guidance for Lambda event sources: visibility at least 6x the function timeout. */
const VISIBILITY_TO_TIMEOUT_RATIO = 6;
/** Below 5 receives a throttled or briefly failing consumer dead-letters healthy messages. */
const MIN_MAX_RECEIVE_COUNT = 5;

let loading;
let cached;

/**
 * Loads everything packaging reads from the TypeScript side, once per `osls package` (osls calls
 * the variable functions of resources.cjs several times). Importing the release handler is safe:
 * a handler module connects to nothing until it is invoked (the template test checks the bundles).
 */
function loadProjectFacts() {
  loading ??= (async () => {
    const [config, metrics, queues, observability, release, backoff, budget, infrastructure, deferral] =
      await Promise.all([
        load('functions/adapters/config.ts'),
        load('functions/adapters/metric-names.ts'),
        load('functions/adapters/queues.ts'),
        load('functions/adapters/observability.ts'),
        load('functions/release/handler.ts'),
        load('functions/cleanup/backoff.ts'),
        load('functions/adapters/connection-budget.ts'),
        load('functions/adapters/infrastructure.ts'),
        load('functions/cleanup/chain-limits.ts'),
      ]);
    cached = {
      CONFIG_DEFAULTS: config.CONFIG_DEFAULTS,
      databaseFailureReportMarginSeconds: config.DATABASE_FAILURE_REPORT_MARGIN_MS / 1000,
      loadConfig: config.loadConfig,
      MetricName: metrics.MetricName,
      METRICS_NAMESPACE: metrics.METRICS_NAMESPACE,
      QUEUE_DEFINITIONS: queues.QUEUE_DEFINITIONS,
      FUNCTION_DEFINITIONS: queues.FUNCTION_DEFINITIONS,
      QueueName: queues.QueueName,
      deadLetterQueueName: queues.deadLetterQueueName,
      SERVICE_NAME: observability.SERVICE_NAME,
      publishMarginSeconds: release.PUBLISH_MARGIN_MS / 1000,
      backoffSeconds: backoff.backoffSeconds,
      connectionBudget: budget.connectionBudget,
      connectionBudgetError: budget.connectionBudgetError,
      FUNCTION_LOG_NAMES: infrastructure.FUNCTION_LOG_NAMES,
      MAX_DEFERRALS: deferral.MAX_DEFERRALS,
    };
    return cached;
  })();
  return loading;
}

/** The facts, once `loadProjectFacts()` has resolved (resources.cjs awaits it first). */
function projectFacts() {
  if (!cached) throw new Error('infra/serverless: projectFacts() called before loadProjectFacts() resolved');
  return cached;
}

/**
 * The configuration the functions will run with: every tunable of config.ts, from the packaging
 * environment or its default. Validated by the functions' own `loadConfig`, so a value that would
 * stop the functions at cold start stops packaging instead, with the same one-line reason.
 * DATABASE_URL and friends are deliberately not read here (see resources.cjs, `environment`).
 *
 * @param {Readonly<Record<string, string | undefined>>} env
 * @returns {Record<string, number>}
 */
function effectiveConfiguration(env) {
  const { CONFIG_DEFAULTS, loadConfig } = projectFacts();
  const names = Object.keys(CONFIG_DEFAULTS);
  loadConfig(Object.fromEntries(names.map((name) => [name, env[name]])));
  return Object.fromEntries(
    names.map((name) => {
      const raw = env[name]?.trim();
      return [name, raw ? Number(raw) : CONFIG_DEFAULTS[name]];
    }),
  );
}

/**
 * The timeout ladder and the connection budget, checked before anything is generated: a
 * deployment that breaks them fails in ways no test of the code catches (a release killed by
 * Lambda mid-delete while its message becomes visible to a second release; a healthy message
 * dead-lettered by SQS; a backlog that scales the functions past what the database accepts).
 *
 * @param {Record<string, number>} config the effective configuration
 */
function assertTimeoutLadder(config) {
  const {
    FUNCTION_DEFINITIONS,
    QUEUE_DEFINITIONS,
    QueueName,
    publishMarginSeconds,
    databaseFailureReportMarginSeconds,
  } = projectFacts();
  const problems = [];
  const releaseTimeout = FUNCTION_DEFINITIONS.release.timeoutSeconds;
  const releaseBudget = config.SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS + publishMarginSeconds;
  if (releaseTimeout < releaseBudget) {
    problems.push(
      `functions.release.timeoutSeconds (${releaseTimeout}) must be at least SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS + the publish margin (${config.SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS} + ${publishMarginSeconds})`,
    );
  }
  // A hung database fails a record within connect + query timeout (never retried in-process);
  // the consumer still needs the margin to report the failed record before its deadline.
  const databaseBound =
    (config.DATABASE_CONNECT_TIMEOUT_MS + config.DATABASE_QUERY_TIMEOUT_MS) / 1000 +
    databaseFailureReportMarginSeconds;
  for (const [name, queue] of Object.entries(QUEUE_DEFINITIONS)) {
    if (!queue.consumer) continue;
    const consumer = FUNCTION_DEFINITIONS[queue.consumer];
    if (!consumer) {
      problems.push(`queues.${name}.consumer names an unknown function "${queue.consumer}"`);
      continue;
    }
    if (consumer.timeoutSeconds < databaseBound) {
      problems.push(
        `functions.${queue.consumer}.timeoutSeconds (${consumer.timeoutSeconds}) must be at least DATABASE_CONNECT_TIMEOUT_MS + DATABASE_QUERY_TIMEOUT_MS + the report margin (${databaseBound} s)`,
      );
    }
    if (queue.visibilityTimeoutSeconds < VISIBILITY_TO_TIMEOUT_RATIO * consumer.timeoutSeconds) {
      problems.push(
        `queues.${name}.visibilityTimeoutSeconds (${queue.visibilityTimeoutSeconds}) must be at least ${VISIBILITY_TO_TIMEOUT_RATIO} x functions.${queue.consumer}.timeoutSeconds (${consumer.timeoutSeconds})`,
      );
    }
    if (queue.maxReceiveCount === null || queue.maxReceiveCount < MIN_MAX_RECEIVE_COUNT) {
      problems.push(
        `queues.${name}.maxReceiveCount (${queue.maxReceiveCount}) must be at least ${MIN_MAX_RECEIVE_COUNT}`,
      );
    }
    if (queue.fifo && consumer.maximumBatchingWindowInSeconds > 0) {
      // Lambda rejects a batching window on a FIFO event source.
      problems.push(
        `functions.${queue.consumer}.maximumBatchingWindowInSeconds must be 0 for the FIFO queue ${name}`,
      );
    }
  }
  const { connectionBudget } = projectFacts();
  let budget;
  try {
    budget = connectionBudget(config.DATABASE_MAX_CONNECTIONS);
  } catch (error) {
    problems.push(error.message);
  }
  if (budget && !budget.fits) problems.push(projectFacts().connectionBudgetError(budget).message);
  if (!QUEUE_DEFINITIONS[QueueName.RUNTIME_RELEASE]?.fifo) {
    problems.push(`${QueueName.RUNTIME_RELEASE} must be FIFO (contract, section 2)`);
  }
  if (problems.length) {
    throw new Error(
      `infra/queues.json and the configuration break the timeout ladder or the connection budget:\n  - ${problems.join('\n  - ')}`,
    );
  }
}

/**
 * Upper bound on how long a message can legitimately stay in a consumed queue: every allowed
 * receive runs to the function timeout, and every retry waits the longest backoff (the jitter's
 * upper end). Older than this, it is neither being processed nor on its way to the DLQ.
 *
 * @param {string} queueName
 * @param {Record<string, number>} config the effective configuration
 */
function retryBudgetSeconds(queueName, config) {
  const { QUEUE_DEFINITIONS, FUNCTION_DEFINITIONS, backoffSeconds } = projectFacts();
  const queue = QUEUE_DEFINITIONS[queueName];
  const timeout = FUNCTION_DEFINITIONS[queue.consumer].timeoutSeconds;
  const policy = {
    baseSeconds: config.CLEANUP_RETRY_BASE_SECONDS,
    maxSeconds: config.CLEANUP_RETRY_MAX_SECONDS,
  };
  let total = queue.maxReceiveCount * timeout;
  for (let attempt = 1; attempt < queue.maxReceiveCount; attempt += 1) {
    total += backoffSeconds(attempt, policy, () => 1);
  }
  return total;
}

module.exports = {
  loadProjectFacts,
  projectFacts,
  effectiveConfiguration,
  assertTimeoutLadder,
  retryBudgetSeconds,
  VISIBILITY_TO_TIMEOUT_RATIO,
  MIN_MAX_RECEIVE_COUNT,
};
