/**
 * The commands as a user types them: `npm run <script> -- --help` through npm and tsx, as
 * package.json wires each one. The other tests start the commands' bundles (test/support/commands.ts),
 * which load the same source faster; this is where a script that names a moved entry file, or
 * a source that only tsx could not load, fails.
 */
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { runChild } from '../support/child-process.ts';
import { COMMAND_ENTRIES } from '../support/command-bundles.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/**
 * Each script, the entry file its bundle is built from (with the argument the script adds), and the
 * first line of its usage.
 */
const SCRIPTS = [
  ['stack', COMMAND_ENTRIES.stack, /^Usage: npm run stack\b/],
  ['start', COMMAND_ENTRIES.start, /^npm start -- \[options\]/],
  ['migrate', COMMAND_ENTRIES.migrate, /^Usage: npm run migrate\b/],
  ['ops', COMMAND_ENTRIES.ops, /^Operator CLI of the runtime cleanup\./],
  ['chaos', COMMAND_ENTRIES.chaos, /^npm run chaos -- \[options\]/],
  ['smoke', COMMAND_ENTRIES.smoke, /^Usage: npm run smoke\b/],
  ['deploy:local', `${COMMAND_ENTRIES.localstack} deploy`, /^Usage: npm run deploy:local\b/],
  ['remove:local', `${COMMAND_ENTRIES.localstack} remove`, /^Usage: npm run deploy:local\b/],
] as const;

const scripts = (
  (await import('../../package.json', { with: { type: 'json' } })) as {
    default: { scripts: Record<string, string> };
  }
).default.scripts;

describe.each(SCRIPTS)('npm run %s', (script, entry, usage) => {
  it('runs the entry file the tests bundle', () => {
    expect(scripts[script]).toMatch(new RegExp(`tsx ${entry.replaceAll('.', '\\.')}$`));
  });

  it('-- --help prints its usage and exits 0', async () => {
    const env: NodeJS.ProcessEnv = {};
    // A fresh `npm run` as a developer types it, not a worker of this Vitest.
    for (const [key, value] of Object.entries(process.env)) {
      if (!key.startsWith('VITEST') && key !== 'NODE_ENV') env[key] = value;
    }
    const run = await runChild('npm', ['run', '--silent', script, '--', '--help'], {
      cwd: ROOT,
      env,
      timeoutMs: 60_000,
    });
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout.trimStart()).toMatch(usage);
  });
});
