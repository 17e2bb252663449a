/**
 * The operator CLI as the tests start it: a child process running the bundle the
 * `runtime-cleanup-ops` bin runs, built as `npm ci` builds it from this checkout's source once per
 * test run (command-bundles.ts), with the test's environment over the worker's. The bin itself
 * (its checks before it loads the bundle) is started by ops-bin.test.ts; `npm run ops` itself (tsx, npm's banner) by the tests that name it:
 * package-scripts, aws-timeouts, database-no-password and template-production.
 */
import { fileURLToPath } from 'node:url';
import { type ChildRun, runChild } from './child-process.ts';
import { commandArgs } from './commands.ts';

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
  return runChild(process.execPath, commandArgs('ops', args), {
    cwd: ROOT,
    env,
    timeoutMs: options.timeoutMs ?? 60_000,
  });
}
