import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startProvisioner } from './server.ts';

/*
 * Runs the local provisioner on its own:
 *   tsx infra/local/provisioner/cli.ts --port 4599 --root DIR [--host H] [--grace-ms N] [--seed N]
 *     [--platform-compatible]   (behave like the platform's deployed provisioner: see ProvisionerMode)
 * Without --root, sandboxes live in a fresh temporary directory. SIGINT/SIGTERM stop it,
 * killing every sandbox first.
 */

function integerOption(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const parsed = Number(value);
  if (!Number.isSafeInteger(parsed) || parsed < 0) {
    throw new Error(`--${name} must be a non-negative integer, got ${JSON.stringify(value)}`);
  }
  return parsed;
}

const { values } = parseArgs({
  options: {
    port: { type: 'string' },
    host: { type: 'string' },
    root: { type: 'string' },
    'grace-ms': { type: 'string' },
    seed: { type: 'string' },
    'platform-compatible': { type: 'boolean' },
  },
  strict: true,
});

const rootDir = values.root ?? (await mkdtemp(join(tmpdir(), 'provisioner-')));
const provisioner = await startProvisioner({
  rootDir,
  port: integerOption('port', values.port),
  host: values.host,
  graceMs: integerOption('grace-ms', values['grace-ms']),
  seed: integerOption('seed', values.seed),
  mode: values['platform-compatible'] ? 'platform' : 'contract',
});
console.log(
  `provisioner (${provisioner.mode} mode) listening on ${provisioner.url} (sandboxes under ${provisioner.rootDir})`,
);

let stopping = false;
async function shutdown(signal: NodeJS.Signals): Promise<void> {
  if (stopping) return;
  stopping = true;
  console.log(`${signal}: stopping the provisioner and its sandboxes`);
  await provisioner.stop();
  process.exit(0);
}
process.on('SIGINT', (signal) => void shutdown(signal));
process.on('SIGTERM', (signal) => void shutdown(signal));
