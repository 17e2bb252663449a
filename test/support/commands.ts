/**
 * The project's commands as a test starts them: `npm run <command> -- args` minus npm and tsx, a
 * child process running the command's bundle built for this test run (command-bundles.ts), with the
 * test's environment. `npm run` itself is started by test/e2e/package-scripts.test.ts.
 */
import { fileURLToPath } from 'node:url';
import { inject } from 'vitest';
import { type ChildRun, runChild } from './child-process.ts';
import type { Command } from './command-bundles.ts';

export type { Command } from './command-bundles.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** What follows `process.execPath` to start `command` with `args`. */
export function commandArgs(command: Command, args: readonly string[] = []): string[] {
  const bundles = inject('commandBundles');
  if (!bundles) {
    throw new Error(
      `no command bundles in this run (a fixture run builds none): "${command}" cannot be started`,
    );
  }
  return [bundles[command], ...args];
}

/** Runs `command` to its end in the repository (or `cwd`); killed after `timeoutMs`. */
export function runCommand(
  command: Command,
  args: readonly string[],
  options: { env: NodeJS.ProcessEnv; timeoutMs: number; cwd?: string; processGroup?: boolean },
): Promise<ChildRun> {
  return runChild(process.execPath, commandArgs(command, args), {
    cwd: options.cwd ?? ROOT,
    env: options.env,
    timeoutMs: options.timeoutMs,
    processGroup: options.processGroup,
  });
}
