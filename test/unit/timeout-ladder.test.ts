/**
 * The timeout ladder and the connection budget (infra/serverless/project.cjs, assertTimeoutLadder),
 * on the function that decides them. That osls reaches it and refuses to package with its message is
 * proven once through the real `npm run package` (test/integration/template.test.ts: a release
 * timeout that does not outlive SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS); each further rule there
 * cost an osls start and proved no more wiring, so the rules are held here.
 */
import { createRequire } from 'node:module';
import { beforeAll, describe, expect, it } from 'vitest';
import { CONFIG_DEFAULTS, DATABASE_FAILURE_REPORT_MARGIN_MS } from '../../functions/adapters/config.ts';
import { connectionBudget } from '../../functions/adapters/connection-budget.ts';
import { FUNCTION_DEFINITIONS } from '../../functions/adapters/queues.ts';
import { PUBLISH_MARGIN_MS } from '../../functions/release/handler.ts';

type Config = Record<keyof typeof CONFIG_DEFAULTS, number>;

const require = createRequire(import.meta.url);
const { assertTimeoutLadder, loadProjectFacts } = require('../../infra/serverless/project.cjs') as {
  assertTimeoutLadder: (config: Config) => void;
  loadProjectFacts: () => Promise<unknown>;
};

const ladder = (changes: Partial<Config>) => () => assertTimeoutLadder({ ...CONFIG_DEFAULTS, ...changes });

beforeAll(async () => {
  // What resources.cjs awaits before osls asks for any setting: infra/queues.json and config.ts.
  await loadProjectFacts();
});

describe('assertTimeoutLadder', () => {
  it('lets the defaults through', () => {
    expect(ladder({})).not.toThrow();
  });

  it('refuses a release timeout that does not outlive SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS and the publish margin', () => {
    const release = FUNCTION_DEFINITIONS.release.timeoutSeconds;
    const longest = release - PUBLISH_MARGIN_MS / 1000;
    expect(ladder({ SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: longest })).not.toThrow();
    expect(ladder({ SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: longest + 1 })).toThrow(
      `functions.release.timeoutSeconds (${release}) must be at least SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS`,
    );
  });

  it('refuses database timeouts that a hung database would make outlive a consumer’s deadline', () => {
    const bound = DATABASE_FAILURE_REPORT_MARGIN_MS / 1000;
    const fenceCheck = FUNCTION_DEFINITIONS.fenceCheck.timeoutSeconds;
    const refused = ladder({ DATABASE_QUERY_TIMEOUT_MS: 40_000 });
    expect(refused).toThrow(
      `functions.fenceCheck.timeoutSeconds (${fenceCheck}) must be at least DATABASE_CONNECT_TIMEOUT_MS + DATABASE_QUERY_TIMEOUT_MS + the report margin (${(CONFIG_DEFAULTS.DATABASE_CONNECT_TIMEOUT_MS + 40_000) / 1000 + bound} s)`,
    );
    // The bound is the consumer's own timeout: the largest query timeout that fits is let through
    // (other consumers aside), one millisecond more is not.
    const fits = (fenceCheck - bound) * 1000 - CONFIG_DEFAULTS.DATABASE_CONNECT_TIMEOUT_MS;
    const fenceCheckRule = /functions\.fenceCheck\.timeoutSeconds/;
    expect(ladder({ DATABASE_QUERY_TIMEOUT_MS: fits })).not.toThrow(fenceCheckRule);
    expect(ladder({ DATABASE_QUERY_TIMEOUT_MS: fits + 1 })).toThrow(fenceCheckRule);
  });

  it('refuses, naming each share, a DATABASE_MAX_CONNECTIONS below what the functions can open together', () => {
    const { total } = connectionBudget(CONFIG_DEFAULTS.DATABASE_MAX_CONNECTIONS);
    expect(ladder({ DATABASE_MAX_CONNECTIONS: total })).not.toThrow();
    const refused = ladder({ DATABASE_MAX_CONNECTIONS: total - 1 });
    expect(refused).toThrow(
      `DATABASE_MAX_CONNECTIONS="${total - 1}" is invalid: must be at least what the functions can open together`,
    );
    expect(refused).toThrow(`= ${total}`);
  });

  it('names every problem at once, so one packaging tells all', () => {
    expect(ladder({ SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: 10_000, DATABASE_MAX_CONNECTIONS: 1 })).toThrow(
      /release\.timeoutSeconds[\s\S]*DATABASE_MAX_CONNECTIONS="1"/,
    );
  });
});
