/**
 * Configuration (docs/integration.md §4): every variable's default, and for every rule a bad value that
 * stops the process with ONE line naming the variable, its value and the rule.
 */
import { describe, expect, it } from 'vitest';
import {
  DATABASE_FAILURE_REPORT_MARGIN_MS,
  loadConfig,
  refuseParameterWithoutUrl,
  requireDatabaseUrlSource,
  requireProvisionerUrl,
  validProvisionerUrl,
} from '../../functions/adapters/config.ts';
import { ConfigError, InfrastructureErrorCode } from '../../functions/adapters/errors.ts';
import { provisionerTokenSource } from '../../functions/adapters/provisioner-token.ts';
import { FUNCTION_DEFINITIONS, QUEUE_DEFINITIONS } from '../../functions/adapters/queues.ts';

const POSITIVE_INTEGER_VARIABLES = [
  'SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS',
  'SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS',
  'SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS',
  'CLEANUP_RETRY_BASE_SECONDS',
  'CLEANUP_RETRY_MAX_SECONDS',
  'FENCE_SWEEP_AFTER_SECONDS',
  'FENCE_SWEEP_INTERVAL_SECONDS',
  'RECLAIM_INTERVAL_SECONDS',
  'RECLAIM_GRACE_SECONDS',
  'RECLAIM_MAX_PER_RUN',
  'RECLAIM_MAX_SHARE_PERCENT',
  'DATABASE_CONNECT_TIMEOUT_MS',
  'DATABASE_QUERY_TIMEOUT_MS',
  'DATABASE_MAX_CONNECTIONS',
] as const;

const BAD_POSITIVE_INTEGERS = [
  '0',
  '-1',
  '1.5',
  'abc',
  '1e3',
  '0x10',
  '+5',
  '7 days',
  'Infinity',
  '9007199254740993',
];

function configErrorOf(env: Record<string, string>): ConfigError {
  try {
    loadConfig(env);
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return error as ConfigError;
  }
  throw new Error(`expected ${JSON.stringify(env)} to be refused`);
}

describe('defaults (docs/integration.md §4)', () => {
  it('uses the contract default of every variable when none is set', () => {
    expect(loadConfig({})).toMatchObject({
      databaseUrl: undefined,
      provisionerUrl: undefined,
      releaseLockTimeoutSeconds: 30,
      provisionerDeleteTimeoutSeconds: 120,
      runtimeCleanupTimeoutSeconds: 155,
      retryBaseSeconds: 10,
      retryMaxSeconds: 900,
      fenceSweepAfterSeconds: 600,
      fenceSweepIntervalSeconds: 60,
      reclaimIntervalSeconds: 300,
      reclaimGraceSeconds: 3600,
      reclaimMaxPerRun: 50,
      reclaimMaxSharePercent: 50,
      sqsEndpoint: undefined,
      databaseConnectTimeoutMs: 5_000,
      databaseQueryTimeoutMs: 20_000,
    });
  });

  it('bounds a hung database well inside the shortest consumer timeout (infra/queues.json)', () => {
    const config = loadConfig({});
    const shortest = Math.min(
      ...Object.values(QUEUE_DEFINITIONS)
        .filter((queue) => queue.consumer)
        .map(
          (queue) => FUNCTION_DEFINITIONS[queue.consumer as keyof typeof FUNCTION_DEFINITIONS].timeoutSeconds,
        ),
    );
    expect(
      config.databaseConnectTimeoutMs + config.databaseQueryTimeoutMs + DATABASE_FAILURE_REPORT_MARGIN_MS,
    ).toBeLessThanOrEqual(shortest * 1000);
    // The server's statement timeout ends a slow statement before the client gives up on it.
    expect(config.databaseQueryTimeoutMs).toBeGreaterThan(config.databaseStatementTimeoutMs);
  });

  it('treats an empty value as unset (the default applies), and tolerates surrounding blanks', () => {
    expect(loadConfig({ SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '' }).releaseLockTimeoutSeconds).toBe(
      30,
    );
    expect(
      loadConfig({ SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: ' 7 ' }).releaseLockTimeoutSeconds,
    ).toBe(7);
  });

  it('reads valid values', () => {
    const config = loadConfig({
      DATABASE_URL: 'postgres://app@db.internal:5432/app',
      SANDBOX_PROVISIONER_URL: 'http://provisioner.internal:8080',
      SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '5',
      SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '20',
      SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '26',
      CLEANUP_RETRY_BASE_SECONDS: '3',
      CLEANUP_RETRY_MAX_SECONDS: '3',
      AWS_ENDPOINT_URL_SQS: 'http://127.0.0.1:4566',
    });
    expect(config).toMatchObject({
      databaseUrl: 'postgres://app@db.internal:5432/app',
      provisionerUrl: 'http://provisioner.internal:8080',
      releaseLockTimeoutSeconds: 5,
      provisionerDeleteTimeoutSeconds: 20,
      runtimeCleanupTimeoutSeconds: 26,
      retryBaseSeconds: 3,
      retryMaxSeconds: 3,
      sqsEndpoint: 'http://127.0.0.1:4566',
    });
  });
});

describe('rules: a bad value is refused with one line naming the variable, the value and the rule', () => {
  it.each(['101', '1000'])(
    'refuses RECLAIM_MAX_SHARE_PERCENT=%s: a share is at most 100 percent',
    (value) => {
      const error = configErrorOf({ RECLAIM_MAX_SHARE_PERCENT: value });
      expect(error.variable).toBe('RECLAIM_MAX_SHARE_PERCENT');
      expect(error.message).not.toContain('\n');
      expect(error.message).toContain(JSON.stringify(value));
      expect(error.message).toContain('must be a percentage from 1 to 100');
    },
  );

  it('reads the reclaimer settings', () => {
    expect(
      loadConfig({
        RECLAIM_INTERVAL_SECONDS: '2',
        RECLAIM_GRACE_SECONDS: '4',
        RECLAIM_MAX_PER_RUN: '3',
        RECLAIM_MAX_SHARE_PERCENT: '100',
      }),
    ).toMatchObject({
      reclaimIntervalSeconds: 2,
      reclaimGraceSeconds: 4,
      reclaimMaxPerRun: 3,
      reclaimMaxSharePercent: 100,
    });
  });

  const cases = POSITIVE_INTEGER_VARIABLES.flatMap((variable) =>
    BAD_POSITIVE_INTEGERS.map((value) => ({ variable, value })),
  );

  it.each(cases)('refuses $variable=$value', ({ variable, value }) => {
    const error = configErrorOf({ [variable]: value });

    expect(error.code).toBe(InfrastructureErrorCode.CONFIG_INVALID);
    expect(error.retryable).toBe(false);
    expect(error.variable).toBe(variable);
    expect(error.message).not.toContain('\n');
    expect(error.message).toContain(variable);
    expect(error.message).toContain(JSON.stringify(value));
    expect(error.message).toContain('must be a positive integer');
  });

  it('keeps the message on one line even when the value holds a newline', () => {
    const error = configErrorOf({ FENCE_SWEEP_AFTER_SECONDS: '60\nINJECTED LOG LINE' });
    expect(error.message.split('\n')).toHaveLength(1);
  });

  it('refuses a cleanup timeout equal to lock wait + delete timeout, naming the sum', () => {
    const error = configErrorOf({
      SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '30',
      SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '120',
      SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '150',
    });
    expect(error.variable).toBe('SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS');
    expect(error.message).toContain('"150"');
    expect(error.message).toContain('30 + 120 = 150');
    expect(error.message).not.toContain('\n');
  });

  it('refuses a longer delete timeout that the default cleanup timeout no longer covers', () => {
    const error = configErrorOf({ SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '200' });
    expect(error.variable).toBe('SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS');
    expect(error.message).toContain('"155"');
    expect(error.message).toContain('30 + 200 = 230');
  });

  it('accepts a cleanup timeout one second above lock wait + delete timeout', () => {
    expect(
      loadConfig({
        SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '30',
        SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '120',
        SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '151',
      }).runtimeCleanupTimeoutSeconds,
    ).toBe(151);
  });

  it('refuses a retry cap below the retry base, naming the base', () => {
    const error = configErrorOf({ CLEANUP_RETRY_BASE_SECONDS: '20', CLEANUP_RETRY_MAX_SECONDS: '19' });
    expect(error.variable).toBe('CLEANUP_RETRY_MAX_SECONDS');
    expect(error.message).toContain('"19"');
    expect(error.message).toContain('CLEANUP_RETRY_BASE_SECONDS (20)');
  });

  it('refuses a retry base above the default cap', () => {
    const error = configErrorOf({ CLEANUP_RETRY_BASE_SECONDS: '901' });
    expect(error.variable).toBe('CLEANUP_RETRY_MAX_SECONDS');
    expect(error.message).toContain('(901)');
  });

  it('refuses a query timeout that the statement timeout does not stay under, naming it', () => {
    const error = configErrorOf({
      DATABASE_STATEMENT_TIMEOUT_MS: '20000',
      DATABASE_QUERY_TIMEOUT_MS: '20000',
    });
    expect(error.variable).toBe('DATABASE_QUERY_TIMEOUT_MS');
    expect(error.message).toContain('"20000"');
    expect(error.message).toContain('DATABASE_STATEMENT_TIMEOUT_MS (20000)');
    // A longer statement timeout alone breaks the default query timeout too.
    expect(configErrorOf({ DATABASE_STATEMENT_TIMEOUT_MS: '25000' }).variable).toBe(
      'DATABASE_QUERY_TIMEOUT_MS',
    );
    expect(
      loadConfig({ DATABASE_STATEMENT_TIMEOUT_MS: '25000', DATABASE_QUERY_TIMEOUT_MS: '25001' })
        .databaseQueryTimeoutMs,
    ).toBe(25_001);
  });

  it.each(['DATABASE_URL', 'AWS_ENDPOINT_URL_SQS'])('refuses a %s that is not a URL', (variable) => {
    const error = configErrorOf({ [variable]: 'not a url' });
    expect(error.variable).toBe(variable);
    expect(error.message).toContain('must be an absolute URL');
  });

  it('leaves SANDBOX_PROVISIONER_URL to the functions that call the provisioner: a bad one stops only them', () => {
    // fence-check, finalize and the sweeper load this configuration too and never call it.
    const config = loadConfig({ SANDBOX_PROVISIONER_URL: 'not a url' });
    let error: unknown;
    try {
      requireProvisionerUrl(config);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).variable).toBe('SANDBOX_PROVISIONER_URL');
    expect((error as ConfigError).message).toContain('must be an absolute URL');
    expect(() => validProvisionerUrl(config)).toThrow(/SANDBOX_PROVISIONER_URL="not a url" is invalid/);
    expect(validProvisionerUrl(loadConfig({}))).toBeUndefined();
  });

  it('requires a database in deployment: DATABASE_URL or the SSM parameter that holds it', () => {
    expect(() => requireDatabaseUrlSource(loadConfig({}))).toThrow(/DATABASE_URL.*DATABASE_URL_PARAMETER/);
    expect(() => requireDatabaseUrlSource(loadConfig({ DATABASE_URL: 'postgres://db/app' }))).not.toThrow();
    expect(() =>
      requireDatabaseUrlSource(loadConfig({ DATABASE_URL_PARAMETER: '/runtime-cleanup/prod/database-url' })),
    ).not.toThrow();
    expect(() => requireProvisionerUrl(loadConfig({}))).toThrow(/SANDBOX_PROVISIONER_URL.*required/);
  });

  it('stops the operator commands given only DATABASE_URL_PARAMETER, instead of acting on the local default database', () => {
    const parameter = '/runtime-cleanup/prod/database-url';
    expect(() => refuseParameterWithoutUrl(loadConfig({ DATABASE_URL_PARAMETER: parameter }))).toThrow(
      new RegExp(`DATABASE_URL.*is required here.*--name ${parameter}`),
    );
    expect(() => refuseParameterWithoutUrl(loadConfig({ DATABASE_URL: 'postgres://db/app' }))).not.toThrow();
    expect(() => refuseParameterWithoutUrl(loadConfig({}))).not.toThrow();
  });

  it('refuses DATABASE_URL and DATABASE_URL_PARAMETER together, and a parameter name SSM would refuse', () => {
    const both = configErrorOf({
      DATABASE_URL: 'postgres://db/app',
      DATABASE_URL_PARAMETER: '/runtime-cleanup/prod/database-url',
    });
    expect(both.variable).toBe('DATABASE_URL_PARAMETER');
    expect(both.message).toContain('one source');
    const bad = configErrorOf({ DATABASE_URL_PARAMETER: '/runtime cleanup/database url' });
    expect(bad.variable).toBe('DATABASE_URL_PARAMETER');
    expect(
      loadConfig({
        DATABASE_URL_PARAMETER:
          'arn:aws:ssm:eu-west-1:123456789012:parameter/runtime-cleanup/prod/database-url',
      }).databaseUrlParameter,
    ).toMatch(/^arn:aws:ssm:/);
  });
});

describe('the provisioner token (SANDBOX_PROVISIONER_TOKEN, SANDBOX_PROVISIONER_TOKEN_PARAMETER)', () => {
  it('takes a bearer token, or the SSM parameter that holds one, and neither by default', () => {
    expect(loadConfig({})).toMatchObject({
      provisionerToken: undefined,
      provisionerTokenParameter: undefined,
    });
    expect(loadConfig({ SANDBOX_PROVISIONER_TOKEN: ' abc.DEF-123_~+/== ' }).provisionerToken).toBe(
      'abc.DEF-123_~+/==',
    );
    expect(
      loadConfig({ SANDBOX_PROVISIONER_TOKEN_PARAMETER: '/runtime-cleanup/prod/sandbox-provisioner-token' })
        .provisionerTokenParameter,
    ).toBe('/runtime-cleanup/prod/sandbox-provisioner-token');
  });

  it('refuses both together: the token has one source', () => {
    const error = configErrorOf({
      SANDBOX_PROVISIONER_TOKEN: 'abc',
      SANDBOX_PROVISIONER_TOKEN_PARAMETER: '/runtime-cleanup/prod/sandbox-provisioner-token',
    });
    expect(error.variable).toBe('SANDBOX_PROVISIONER_TOKEN_PARAMETER');
    expect(error.message).toContain('must not be set together with SANDBOX_PROVISIONER_TOKEN');
    expect(error.message).not.toContain('"abc"');
  });

  it.each([
    ['a blank inside', 's3cr3t tok'],
    ['a line break', 's3cr3t\nX-Injected: 1'],
    ['a quote', 's3cr3t"'],
  ])('refuses a token with %s, naming the variable and the rule, never the value', (_name, token) => {
    const error = configErrorOf({ SANDBOX_PROVISIONER_TOKEN: token });
    expect(error.variable).toBe('SANDBOX_PROVISIONER_TOKEN');
    expect(error.message).toMatch(
      /^SANDBOX_PROVISIONER_TOKEN="\*\*\*" is invalid: must be a token of RFC 6750's form/,
    );
    for (const text of [error.message, error.value, JSON.stringify(error.details)])
      expect(text).not.toContain('s3cr3t');
  });

  it('refuses a parameter name SSM would refuse', () => {
    expect(configErrorOf({ SANDBOX_PROVISIONER_TOKEN_PARAMETER: '/runtime cleanup/token' }).variable).toBe(
      'SANDBOX_PROVISIONER_TOKEN_PARAMETER',
    );
  });

  it('is refused, where SSM is not read, as a parameter alone, with the way to export it', () => {
    const parameter = '/runtime-cleanup/prod/sandbox-provisioner-token';
    const config = loadConfig({ SANDBOX_PROVISIONER_TOKEN_PARAMETER: parameter });
    expect(() => provisionerTokenSource(config)).toThrow(
      new RegExp(`SANDBOX_PROVISIONER_TOKEN.*is required here.*--name ${parameter}`),
    );
    expect(provisionerTokenSource(loadConfig({}))).toBeUndefined();
    expect(provisionerTokenSource(loadConfig({ SANDBOX_PROVISIONER_TOKEN: 'abc' }))?.origin).toBe(
      'SANDBOX_PROVISIONER_TOKEN',
    );
  });
});

describe('DATABASE_DRIVER (contract v1.2)', () => {
  it('is neon or tcp as written (blanks trimmed); unset or empty leaves the choice to the URL’s host', () => {
    expect(loadConfig({ DATABASE_DRIVER: 'neon' }).databaseDriver).toBe('neon');
    expect(loadConfig({ DATABASE_DRIVER: ' tcp ' }).databaseDriver).toBe('tcp');
    expect(loadConfig({}).databaseDriver).toBeUndefined();
    expect(loadConfig({ DATABASE_DRIVER: '  ' }).databaseDriver).toBeUndefined();
  });

  it.each(['pg', 'Neon', 'TCP', 'postgres', 'neon,tcp'])(
    'refuses %j in one line naming the variable, the value and the rule',
    (value) => {
      const error = configErrorOf({ DATABASE_DRIVER: value });
      expect(error.variable).toBe('DATABASE_DRIVER');
      expect(error.message).toBe(
        `DATABASE_DRIVER=${JSON.stringify(value)} is invalid: must be 'neon' or 'tcp' (unset: 'neon' for a DATABASE_URL on Neon's hosts, *.neon.tech or *.postgres.vercel-storage.com, 'tcp' for any other)`,
      );
    },
  );
});

describe('secrets', () => {
  it.each([
    ['a bad port', 'postgres://admin:s3cr3t-pw@db.example:99999/app'],
    ['an @ inside the password', 'postgres://admin:s3cr3t@pw@db.example:99999/app'],
    ['a space in the host', 'postgres://admin:s3cr3t-pw@db example/app'],
    ['a space and an @ in the password', 'postgres://admin:s3cr3t pw@x@db.example:99999/app'],
    ['an unterminated IPv6 host', 'postgres://admin:s3cr3t-pw@[::1/app'],
  ])('never prints the DATABASE_URL password in a ConfigError (URL with %s)', (_name, url) => {
    const error = configErrorOf({ DATABASE_URL: url });

    for (const text of [error.message, error.value, JSON.stringify(error.details), String(error)]) {
      expect(text).not.toContain('s3cr3t');
      expect(text).not.toContain('pw@');
    }
    expect(error.message).toContain('DATABASE_URL');
    expect(error.message).toContain('admin');
  });
});

describe('upper bounds: a duration longer than a timer can hold is refused, not fired at once', () => {
  const DURATIONS = POSITIVE_INTEGER_VARIABLES.filter((name) => /_(MS|SECONDS)$/.test(name));
  // Each unit's largest value a timer holds, and the next one.
  const timerMax = (name: string) => (name.endsWith('_MS') ? 2 ** 31 - 1 : Math.floor((2 ** 31 - 1) / 1000));

  it.each(DURATIONS.filter((name) => !name.startsWith('CLEANUP_RETRY_')))(
    'refuses %s one past the timer limit, and names the bound',
    (variable) => {
      const tooLong = String(timerMax(variable) + 1);
      const error = configErrorOf({ [variable]: tooLong });
      expect(error.variable).toBe(variable);
      expect(error.message).toContain(`must be at most ${timerMax(variable)}`);
      expect(error.message).toContain('timer');
    },
  );

  it('really needs the bound: a timer past 2^31-1 ms fires at once (Node prints a TimeoutOverflowWarning)', async () => {
    const fired = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(true), 2 ** 31);
      setTimeout(() => {
        clearTimeout(timer);
        resolve(false);
      }, 200);
    });
    expect(fired).toBe(true);
  });

  it('accepts the largest value of each duration the other rules allow', () => {
    expect(loadConfig({ FENCE_SWEEP_AFTER_SECONDS: String(timerMax('S')) }).fenceSweepAfterSeconds).toBe(
      2_147_483,
    );
    expect(loadConfig({ DATABASE_LOCK_TIMEOUT_MS: String(2 ** 31 - 1) }).databaseLockTimeoutMs).toBe(
      2 ** 31 - 1,
    );
  });

  it.each(['CLEANUP_RETRY_BASE_SECONDS', 'CLEANUP_RETRY_MAX_SECONDS'])(
    'refuses %s beyond SQS’s 12-hour visibility limit',
    (variable) => {
      const error = configErrorOf({
        CLEANUP_RETRY_BASE_SECONDS: variable === 'CLEANUP_RETRY_BASE_SECONDS' ? '43201' : '10',
        CLEANUP_RETRY_MAX_SECONDS: '43201',
      });
      expect(error.variable).toBe(
        variable === 'CLEANUP_RETRY_BASE_SECONDS' ? variable : 'CLEANUP_RETRY_MAX_SECONDS',
      );
      expect(error.message).toContain('must be at most 43200');
    },
  );

  it('refuses an absurd connection budget', () => {
    expect(configErrorOf({ DATABASE_MAX_CONNECTIONS: '1000000' }).message).toContain(
      'must be at most 262143',
    );
  });
});

describe('SANDBOX_PROVISIONER_URL must be http(s)', () => {
  it.each([
    'file:///etc/passwd',
    'ftp://provisioner.internal/',
    'javascript:alert(1)',
    'data:text/plain,hi',
    'htp://provisioner.internal',
    'ws://provisioner.internal',
  ])('refuses %s at config load with a clear message', (url) => {
    const config = loadConfig({ SANDBOX_PROVISIONER_URL: url });
    expect(() => requireProvisionerUrl(config)).toThrow(ConfigError);
    expect(() => validProvisionerUrl(config)).toThrow(
      /SANDBOX_PROVISIONER_URL=.* must be an http:\/\/ or https:\/\/ URL/,
    );
  });

  it.each(['http://provisioner.internal:8080', 'https://provisioner.example.com/base/'])(
    'accepts %s',
    (url) => {
      expect(requireProvisionerUrl(loadConfig({ SANDBOX_PROVISIONER_URL: url }))).toBe(url);
    },
  );
});
