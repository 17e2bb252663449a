/**
 * `npm run bench:ops-start [-- --runs N]`: how long the operator CLI takes to answer `--help`, the
 * start every command pays before it does anything, run after run in child processes:
 *
 *   npm run ops, cold tsx  npm, then tsx compiling infra/ops/cli.ts and its modules (before the bin)
 *   npm run ops            the same with tsx's cache of compiled modules filled by an earlier run
 *   tsx                    that without npm (what the e2e tests spawned before their command bundles)
 *   bin, cold cache        bin/runtime-cleanup-ops.mjs with an empty V8 compile cache (a first run)
 *   bin                    the bin as it runs every time after that
 *
 * Needs the bundle (`npm run build:ops`). Wall-clock figures: run it on a quiet machine; the load
 * average at start and end is printed beside them. Nothing here is asserted by a test.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const BIN = join(ROOT, 'bin/runtime-cleanup-ops.mjs');

interface Way {
  name: string;
  command: string;
  args: string[];
  /** A fresh environment per run, for the cold-cache way. */
  env?: () => { env: NodeJS.ProcessEnv; cleanup: () => void };
}

function timeOnce(way: Way): number {
  const fresh = way.env?.();
  const started = process.hrtime.bigint();
  const run = spawnSync(way.command, way.args, {
    cwd: ROOT,
    env: fresh?.env ?? process.env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const elapsed = Number(process.hrtime.bigint() - started) / 1e6;
  fresh?.cleanup();
  if (run.status !== 0) throw new Error(`${way.name} exited ${run.status}: ${run.stderr.toString()}`);
  return elapsed;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

const { values } = parseArgs({ options: { runs: { type: 'string', default: '10' } } });
const runs = Number(values.runs);
if (!Number.isInteger(runs) || runs < 1)
  throw new Error(`--runs must be a positive integer, not ${values.runs}`);
if (!existsSync(join(ROOT, 'dist/ops.mjs'))) {
  console.error('the bundle dist/ops.mjs is missing: npm run build:ops');
  process.exit(2);
}

const NPM_RUN_OPS = ['run', '--silent', 'ops', '--', '--help'];

const ways: Way[] = [
  {
    name: 'npm run ops, cold tsx',
    command: 'npm',
    args: NPM_RUN_OPS,
    env: () => ({ env: { ...process.env, TSX_DISABLE_CACHE: '1' }, cleanup: () => {} }),
  },
  { name: 'npm run ops', command: 'npm', args: NPM_RUN_OPS },
  {
    name: 'tsx',
    command: process.execPath,
    args: ['--disable-warning=ExperimentalWarning', '--import', 'tsx', 'infra/ops/cli.ts', '--help'],
  },
  {
    name: 'bin, cold cache',
    command: process.execPath,
    args: [BIN, '--help'],
    env: () => {
      const cache = mkdtempSync(join(tmpdir(), 'rc-ops-compile-cache-'));
      return {
        env: { ...process.env, NODE_COMPILE_CACHE: cache },
        cleanup: () => rmSync(cache, { recursive: true, force: true }),
      };
    },
  },
  { name: 'bin', command: process.execPath, args: [BIN, '--help'] },
];

const load = () =>
  loadavg()
    .map((value) => value.toFixed(2))
    .join(' ');
console.log(`ops --help, ${runs} runs each, Node ${process.version}, load average ${load()}`);
// Fill the caches the warm ways read: tsx's compiled modules and the bin's V8 compile cache.
for (const way of ways.filter((candidate) => !candidate.env)) timeOnce(way);
for (const way of ways) {
  const times = Array.from({ length: runs }, () => timeOnce(way));
  console.log(
    `${way.name.padEnd(22)} median ${median(times).toFixed(0).padStart(5)} ms   min ${Math.min(...times)
      .toFixed(0)
      .padStart(5)} ms   max ${Math.max(...times)
      .toFixed(0)
      .padStart(5)} ms`,
  );
}
console.log(`load average at the end ${load()}`);
