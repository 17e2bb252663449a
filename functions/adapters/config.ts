import {
  DATABASE_DRIVERS,
  type DatabaseDriver,
  isDatabaseDriver,
  NEON_HOST_SUFFIXES,
} from './database-driver.ts';
import { ConfigError } from './errors.ts';
import { REDACTED, redactConnectionString } from './redact.ts';

/**
 * Configuration, parsed and validated once at cold start. The names, defaults and rules are the
 * contract's (section 4); a value that breaks a rule stops the process with one line naming the
 * variable, its value and the rule, before anything is processed.
 */
export interface CleanupConfig {
  databaseUrl: string | undefined;
  /**
   * Deployed: the SSM SecureString parameter that holds the connection string, read at cold start
   * (adapters/database-url.ts), so no environment variable ever holds the password.
   */
  databaseUrlParameter: string | undefined;
  /** `host:port` of a local WebSocket bridge for the Neon driver; unset in deployment. */
  databaseWsProxy: string | undefined;
  /**
   * DATABASE_DRIVER as set. Unset means "by the URL's host" (database-driver.ts), decided where the
   * URL is known: deployed, it is read from SSM after this.
   */
  databaseDriver: DatabaseDriver | undefined;
  /**
   * As given, not yet validated: only the release function calls the provisioner, so only it (and
   * the local stack) validates it, with `requireProvisionerUrl`. A bad value must not stop the
   * functions that never use it.
   */
  provisionerUrl: string | undefined;
  /**
   * The provisioner's bearer token (contract v1.2, section 4): given as is locally and in tests
   * (SANDBOX_PROVISIONER_TOKEN), or deployed as the SSM SecureString that holds it
   * (SANDBOX_PROVISIONER_TOKEN_PARAMETER, read at cold start by adapters/provisioner-token.ts).
   * Never both; never logged.
   */
  provisionerToken: string | undefined;
  provisionerTokenParameter: string | undefined;
  releaseLockTimeoutSeconds: number;
  provisionerDeleteTimeoutSeconds: number;
  runtimeCleanupTimeoutSeconds: number;
  retryBaseSeconds: number;
  retryMaxSeconds: number;
  fenceSweepAfterSeconds: number;
  fenceSweepIntervalSeconds: number;
  /** How often the reclaimer lists the provisioner's sandboxes (deployed: a schedule). */
  reclaimIntervalSeconds: number;
  /**
   * How long a sandbox must have been seen leaked (its scope idle that long too) before it is
   * reclaimed: a sandbox created a moment ago, before the platform recorded it, is never deleted.
   */
  reclaimGraceSeconds: number;
  /** The most sandboxes one reclaim run deletes. */
  reclaimMaxPerRun: number;
  /**
   * Above this share (percent) of the listing found leaked at once, a reclaim run trusts neither
   * side (an empty database pointed at a full provisioner): it deletes nothing and says why.
   */
  reclaimMaxSharePercent: number;
  sqsEndpoint: string | undefined;
  /** Deployed queue names carry a stage prefix; the local stack uses the base names. */
  queueNamePrefix: string;
  /** Bounds for every cleanup transaction (`SET LOCAL`), so a stuck lock fails fast instead of piling up. */
  databaseLockTimeoutMs: number;
  databaseStatementTimeoutMs: number;
  /**
   * Client-side bounds, so a database that never answers fails one record in time instead of
   * hanging the invocation: getting a connection (pool slot included), and one statement's answer.
   */
  databaseConnectTimeoutMs: number;
  databaseQueryTimeoutMs: number;
  /** The most connections all functions together may open (checked by adapters/connection-budget.ts). */
  databaseMaxConnections: number;
}

export const CONFIG_DEFAULTS = {
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: 30,
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: 120,
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: 155,
  CLEANUP_RETRY_BASE_SECONDS: 10,
  CLEANUP_RETRY_MAX_SECONDS: 900,
  FENCE_SWEEP_AFTER_SECONDS: 600,
  FENCE_SWEEP_INTERVAL_SECONDS: 60,
  RECLAIM_INTERVAL_SECONDS: 300,
  RECLAIM_GRACE_SECONDS: 3600,
  RECLAIM_MAX_PER_RUN: 50,
  RECLAIM_MAX_SHARE_PERCENT: 50,
  DATABASE_LOCK_TIMEOUT_MS: 5_000,
  DATABASE_STATEMENT_TIMEOUT_MS: 15_000,
  // Connect + query timeout (25 s) leaves DATABASE_FAILURE_REPORT_MARGIN_MS of the shortest
  // consumer timeout (30 s, infra/queues.json); check-config and packaging check it.
  DATABASE_CONNECT_TIMEOUT_MS: 5_000,
  DATABASE_QUERY_TIMEOUT_MS: 20_000,
  /**
   * The smallest Neon compute (0.25 CU) allows 104 connections, 7 of them kept for Neon's own
   * superuser: 97 for applications. Half of them leaves the other half to the agent platform,
   * which shares the database. Behind the pooled endpoint the same number bounds the server
   * connections PgBouncer opens for us (its pool is 90% of max_connections per user and database).
   */
  DATABASE_MAX_CONNECTIONS: 50,
} as const;

/**
 * What a consumer needs after a database operation failed on its bounds, to set the record's retry
 * delay (or dead-letter it) and return the partial batch response before Lambda's deadline. A
 * hung connect or statement fails within connect + query timeout (a timeout is never retried
 * in-process), so that sum plus this margin must fit the shortest consumer function timeout.
 */
export const DATABASE_FAILURE_REPORT_MARGIN_MS = 5_000;

type Env = Readonly<Record<string, string | undefined>>;

/**
 * The longest delay a Node.js timer can hold: a longer one (setTimeout, AbortSignal.timeout)
 * overflows and fires at once, so a "one month" lock timeout would time out immediately.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * The upper bound of each numeric setting, and why. Every duration is used as a timer (seconds
 * × 1000), so none may exceed MAX_TIMER_MS; the retry delays also become SQS visibility changes,
 * which SQS caps at 12 hours. DATABASE_MAX_CONNECTIONS is a count, not a duration.
 */
const SECONDS_TIMER_MAX = Math.floor(MAX_TIMER_MS / 1000);
const SQS_MAX_VISIBILITY_SECONDS = 43_200;
const UPPER_BOUNDS: Record<keyof typeof CONFIG_DEFAULTS, { max: number; why: string }> = {
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: secondsTimer(),
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: secondsTimer(),
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: secondsTimer(),
  CLEANUP_RETRY_BASE_SECONDS: {
    max: SQS_MAX_VISIBILITY_SECONDS,
    why: 'a retry delay is an SQS visibility change, at most 12 hours',
  },
  CLEANUP_RETRY_MAX_SECONDS: {
    max: SQS_MAX_VISIBILITY_SECONDS,
    why: 'a retry delay is an SQS visibility change, at most 12 hours',
  },
  FENCE_SWEEP_AFTER_SECONDS: secondsTimer(),
  FENCE_SWEEP_INTERVAL_SECONDS: secondsTimer(),
  DATABASE_LOCK_TIMEOUT_MS: millisecondsTimer(),
  DATABASE_STATEMENT_TIMEOUT_MS: millisecondsTimer(),
  DATABASE_CONNECT_TIMEOUT_MS: millisecondsTimer(),
  DATABASE_QUERY_TIMEOUT_MS: millisecondsTimer(),
  // PostgreSQL's own ceiling for max_connections.
  DATABASE_MAX_CONNECTIONS: { max: 262_143, why: "PostgreSQL's largest max_connections" },
  RECLAIM_INTERVAL_SECONDS: secondsTimer(),
  RECLAIM_GRACE_SECONDS: secondsTimer(),
  // One run's DELETEs are sent within one invocation (at most 15 minutes).
  RECLAIM_MAX_PER_RUN: { max: 10_000, why: 'more DELETEs than one reclaimer run can send' },
  RECLAIM_MAX_SHARE_PERCENT: { max: 100, why: 'a share of the listing' },
};

function secondsTimer() {
  return { max: SECONDS_TIMER_MAX, why: 'longer than a timer can wait (about 24.8 days)' };
}

function millisecondsTimer() {
  return { max: MAX_TIMER_MS, why: 'longer than a timer can wait (2^31-1 ms, about 24.8 days)' };
}

function positiveInteger(env: Env, name: keyof typeof CONFIG_DEFAULTS): number {
  const raw = env[name];
  if (raw === undefined || raw.trim() === '') return CONFIG_DEFAULTS[name];
  const text = raw.trim();
  const value = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(value) || value <= 0) {
    throw new ConfigError(name, raw, 'must be a positive integer');
  }
  const { max, why } = UPPER_BOUNDS[name];
  if (name === 'RECLAIM_MAX_SHARE_PERCENT' && value > max) {
    throw new ConfigError(name, raw, 'must be a percentage from 1 to 100');
  }
  if (value > max) throw new ConfigError(name, raw, `must be at most ${max}: ${why}`);
  return value;
}

function optionalUrl(env: Env, name: string): string | undefined {
  const raw = env[name];
  if (raw === undefined || raw.trim() === '') return undefined;
  try {
    new URL(raw);
  } catch {
    throw new ConfigError(name, redactUrl(raw), 'must be an absolute URL');
  }
  return raw.trim();
}

/**
 * A connection string or URL as it may be printed: its password and token-like query values
 * hidden, in URL or keyword form (the one implementation is `redactConnectionString`).
 */
/**
 * DATABASE_URL: a URL whose scheme is PostgreSQL's. A `mysql://` (or `http://`) URL parses as a
 * URL, and used to fail only later, as an unreachable database or a driver error naming nothing.
 */
function optionalPostgresUrl(env: Env, name: string): string | undefined {
  const url = optionalUrl(env, name);
  if (url === undefined) return undefined;
  const scheme = new URL(url).protocol;
  if (scheme !== 'postgres:' && scheme !== 'postgresql:') {
    throw new ConfigError(
      name,
      redactUrl(url),
      `must be a postgres:// or postgresql:// URL: ${scheme}// is not PostgreSQL, and this project speaks only PostgreSQL`,
    );
  }
  return url;
}

export function redactUrl(raw: string): string {
  return redactConnectionString(raw);
}

export function loadConfig(env: Env = process.env): CleanupConfig {
  const releaseLockTimeoutSeconds = positiveInteger(env, 'SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS');
  const provisionerDeleteTimeoutSeconds = positiveInteger(env, 'SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS');
  const runtimeCleanupTimeoutSeconds = positiveInteger(env, 'SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS');
  if (runtimeCleanupTimeoutSeconds <= releaseLockTimeoutSeconds + provisionerDeleteTimeoutSeconds) {
    throw new ConfigError(
      'SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS',
      String(env.SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS ?? runtimeCleanupTimeoutSeconds),
      `must be greater than lock wait + delete timeout (${releaseLockTimeoutSeconds} + ${provisionerDeleteTimeoutSeconds} = ${releaseLockTimeoutSeconds + provisionerDeleteTimeoutSeconds})`,
    );
  }
  const retryBaseSeconds = positiveInteger(env, 'CLEANUP_RETRY_BASE_SECONDS');
  const retryMaxSeconds = positiveInteger(env, 'CLEANUP_RETRY_MAX_SECONDS');
  if (retryMaxSeconds < retryBaseSeconds) {
    throw new ConfigError(
      'CLEANUP_RETRY_MAX_SECONDS',
      String(env.CLEANUP_RETRY_MAX_SECONDS ?? retryMaxSeconds),
      `must be at least CLEANUP_RETRY_BASE_SECONDS (${retryBaseSeconds})`,
    );
  }
  const databaseStatementTimeoutMs = positiveInteger(env, 'DATABASE_STATEMENT_TIMEOUT_MS');
  const databaseQueryTimeoutMs = positiveInteger(env, 'DATABASE_QUERY_TIMEOUT_MS');
  if (databaseQueryTimeoutMs <= databaseStatementTimeoutMs) {
    // The server's statement_timeout must end a slow statement first: it reports a clean error on a
    // connection that stays usable, where the client's timeout has to throw the connection away.
    throw new ConfigError(
      'DATABASE_QUERY_TIMEOUT_MS',
      String(env.DATABASE_QUERY_TIMEOUT_MS ?? databaseQueryTimeoutMs),
      `must be greater than DATABASE_STATEMENT_TIMEOUT_MS (${databaseStatementTimeoutMs})`,
    );
  }
  const reclaimMaxSharePercent = positiveInteger(env, 'RECLAIM_MAX_SHARE_PERCENT');
  const databaseUrl = optionalPostgresUrl(env, 'DATABASE_URL');
  const databaseUrlParameter = optionalParameterName(env, 'DATABASE_URL_PARAMETER');
  if (databaseUrl && databaseUrlParameter) {
    throw new ConfigError(
      'DATABASE_URL_PARAMETER',
      databaseUrlParameter,
      'must not be set together with DATABASE_URL: the connection string has one source',
    );
  }
  return {
    databaseUrl,
    databaseUrlParameter,
    databaseWsProxy: env.DATABASE_WS_PROXY?.trim() || undefined,
    databaseDriver: optionalDatabaseDriver(env),
    provisionerUrl: env.SANDBOX_PROVISIONER_URL?.trim() || undefined,
    ...provisionerTokenSettings(env),
    releaseLockTimeoutSeconds,
    provisionerDeleteTimeoutSeconds,
    runtimeCleanupTimeoutSeconds,
    retryBaseSeconds,
    retryMaxSeconds,
    fenceSweepAfterSeconds: positiveInteger(env, 'FENCE_SWEEP_AFTER_SECONDS'),
    fenceSweepIntervalSeconds: positiveInteger(env, 'FENCE_SWEEP_INTERVAL_SECONDS'),
    reclaimIntervalSeconds: positiveInteger(env, 'RECLAIM_INTERVAL_SECONDS'),
    reclaimGraceSeconds: positiveInteger(env, 'RECLAIM_GRACE_SECONDS'),
    reclaimMaxPerRun: positiveInteger(env, 'RECLAIM_MAX_PER_RUN'),
    reclaimMaxSharePercent,
    sqsEndpoint: optionalUrl(env, 'AWS_ENDPOINT_URL_SQS'),
    queueNamePrefix: env.QUEUE_NAME_PREFIX?.trim() ?? '',
    databaseLockTimeoutMs: positiveInteger(env, 'DATABASE_LOCK_TIMEOUT_MS'),
    databaseStatementTimeoutMs,
    databaseConnectTimeoutMs: positiveInteger(env, 'DATABASE_CONNECT_TIMEOUT_MS'),
    databaseQueryTimeoutMs,
    databaseMaxConnections: positiveInteger(env, 'DATABASE_MAX_CONNECTIONS'),
  };
}

/** DATABASE_DRIVER: `neon` or `tcp`, as written (a driver's name, not a word to guess at). */
function optionalDatabaseDriver(env: Env): DatabaseDriver | undefined {
  const raw = env.DATABASE_DRIVER;
  if (raw === undefined || raw.trim() === '') return undefined;
  const value = raw.trim();
  if (!isDatabaseDriver(value)) {
    throw new ConfigError(
      'DATABASE_DRIVER',
      raw,
      `must be ${DATABASE_DRIVERS.map((name) => `'${name}'`).join(' or ')} (unset: 'neon' for a DATABASE_URL on Neon's hosts, *${NEON_HOST_SUFFIXES.join(' or *')}, 'tcp' for any other)`,
    );
  }
  return value;
}

/** SSM's rule for parameter names (letters, digits, `_.-/`), or the parameter's ARN. */
const PARAMETER_NAME = /^(arn:[\w-]+:ssm:[\w-]+:\d{12}:parameter)?[\w.\-/]{1,1011}$/;

function optionalParameterName(env: Env, name: string): string | undefined {
  const raw = env[name]?.trim();
  if (!raw) return undefined;
  if (!PARAMETER_NAME.test(raw)) {
    throw new ConfigError(name, raw, 'must be an SSM parameter name (letters, digits and _ . - /) or ARN');
  }
  return raw;
}

/**
 * RFC 6750's b64token, what may follow `Bearer ` in an Authorization header: a value with a blank,
 * a line break or a control character would fail every request (undici refuses such a header) or
 * split it, instead of failing here.
 */
export const BEARER_TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/;

/** The rule a token breaks, worded without showing it (or undefined when it is a bearer token). */
export function bearerTokenRefusal(token: string): string | undefined {
  return BEARER_TOKEN.test(token)
    ? undefined
    : `must be a token of RFC 6750's form (letters, digits and - . _ ~ + /, then optional =); ${token.length} characters, value not shown`;
}

function provisionerTokenSettings(
  env: Env,
): Pick<CleanupConfig, 'provisionerToken' | 'provisionerTokenParameter'> {
  const provisionerToken = env.SANDBOX_PROVISIONER_TOKEN?.trim() || undefined;
  if (provisionerToken !== undefined) {
    const refusal = bearerTokenRefusal(provisionerToken);
    // The value is a secret: the line names the variable and the rule, never the token.
    if (refusal) throw new ConfigError('SANDBOX_PROVISIONER_TOKEN', REDACTED, refusal);
  }
  const provisionerTokenParameter = optionalParameterName(env, 'SANDBOX_PROVISIONER_TOKEN_PARAMETER');
  if (provisionerToken && provisionerTokenParameter) {
    throw new ConfigError(
      'SANDBOX_PROVISIONER_TOKEN_PARAMETER',
      provisionerTokenParameter,
      'must not be set together with SANDBOX_PROVISIONER_TOKEN: the token has one source',
    );
  }
  return { provisionerToken, provisionerTokenParameter };
}

/** Every deployed function needs the database: its URL, or the parameter that holds it. */
export function requireDatabaseUrlSource(config: CleanupConfig): void {
  if (!config.databaseUrl && !config.databaseUrlParameter) {
    throw new ConfigError(
      'DATABASE_URL',
      '',
      'is required in deployment (or DATABASE_URL_PARAMETER, the SSM SecureString parameter holding it)',
    );
  }
}

/**
 * The operator's commands (`npm run migrate`, `npm run ops`) take a plain DATABASE_URL. Given only
 * the deployed functions' DATABASE_URL_PARAMETER they would fall back to the local default and act
 * on the wrong database: refused, with the way to get the URL.
 */
export function refuseParameterWithoutUrl(config: CleanupConfig): void {
  if (config.databaseUrlParameter && !config.databaseUrl) {
    throw new ConfigError(
      'DATABASE_URL',
      '',
      `is required here: this command does not read DATABASE_URL_PARAMETER; export it from the parameter first (aws ssm get-parameter --with-decryption --name ${config.databaseUrlParameter} --query Parameter.Value --output text)`,
    );
  }
}

/**
 * SANDBOX_PROVISIONER_URL, validated; undefined when unset (the local stack then starts its own).
 * Only http and https: the client speaks HTTP, and any other scheme (file:, ftp:, javascript:, a
 * typo such as htp:) would fail every delete with a confusing error instead of at start.
 */
export function validProvisionerUrl(config: CleanupConfig): string | undefined {
  const url = optionalUrl({ SANDBOX_PROVISIONER_URL: config.provisionerUrl }, 'SANDBOX_PROVISIONER_URL');
  if (url === undefined) return undefined;
  const parsed = new URL(url);
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new ConfigError(
      'SANDBOX_PROVISIONER_URL',
      redactUrl(url),
      `must be an http:// or https:// URL (not ${parsed.protocol})`,
    );
  }
  if (parsed.hostname === '') {
    throw new ConfigError('SANDBOX_PROVISIONER_URL', redactUrl(url), 'must name a host');
  }
  return url;
}

/** What the release function cannot run without (and no other function needs). */
export function requireProvisionerUrl(config: CleanupConfig): string {
  const url = validProvisionerUrl(config);
  if (!url) throw new ConfigError('SANDBOX_PROVISIONER_URL', '', 'is required in deployment');
  return url;
}
