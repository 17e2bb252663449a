/**
 * The operator CLI as the tests start it: a child process running the bundle the
 * `runtime-cleanup-ops` bin runs, built from this checkout's source once per test run
 * (global-setup.ts), with the test's environment over the worker's. `npm run ops` itself (tsx,
 * npm's banner) is proven by the tests that name it: package-scripts, aws-timeouts,
 * database-no-password, template-production and ops-bin.
 */
import { fileURLToPath } from 'node:url';
import { inject } from 'vitest';
import { type ChildRun, runChild } from './child-process.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

export interface OpsCliOptions {
  /** Over the worker's environment; `undefined` removes a variable. */
  env?: Record<string, string | undefined>;
  /** The child is killed after this (default 60 s), so a hang fails on its output. */
  timeoutMs?: number;
}

export function runOpsCli(args: string[], options: OpsCliOptions = {}): Promise<ChildRun> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const [key, value] of Object.entries(options.env ?? {})) {
    if (value === undefined) delete env[key];
    else env[key] = value;
  }
  return runChild(process.execPath, [inject('opsBundle'), ...args], {
    cwd: ROOT,
    env,
    timeoutMs: options.timeoutMs ?? 60_000,
  });
}
