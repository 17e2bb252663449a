/**
 * The project's commands as the tests start them: each entry file built from this checkout's
 * source, once per test run (global-setup.ts), into one ES module per command, its dependencies
 * included (NODE_COMMAND_BUNDLE); the operator CLI exactly as its bin's bundle is built
 * (infra/ops/build-bundle.mjs). Node then loads a few files
 * instead of tsx compiling some seventy to two hundred modules at every start: about 0.4 s of CPU a
 * start against 1.7 s, and the e2e tier starts these commands over a hundred times across its passes
 * on a two-core machine. (Leaving the dependencies outside, `packages: 'external'`, measured
 * 0.8 s: Node then resolves and loads each of their files.)
 *
 * What the bundles change is how the code is loaded, never what it does: every loaded file keeps its
 * own `import.meta.url`, `__dirname` and `__filename` (keepFileLocation below), so what a module
 * reads beside itself (infra/sql/, infra/migrations/, pino's transport worker) is found where it
 * is; and the bundles are written to a folder of the run's own under the system's temporary folder,
 * with a `node_modules` link to the repository's, so that what a dependency resolves at run time
 * (a worker's `require.resolve`) is found too, while the repository's node_modules may stay
 * read-only. `npm run <command>` itself (npm, tsx) is started by test/e2e/package-scripts.test.ts.
 */
import { mkdtemp, readdir, readFile, rm, stat, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build, type Plugin } from 'esbuild';
import { buildOpsBundle, NODE_COMMAND_BUNDLE } from '../../infra/ops/build-bundle.mjs';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Each command's entry file, as package.json's script (or the test's own child) starts it. */
export const COMMAND_ENTRIES = {
  stack: 'infra/local/stack-cli.ts',
  start: 'infra/local/demo/cli.ts',
  migrate: 'infra/migrate-cli.ts',
  ops: 'infra/ops/cli.ts',
  chaos: 'test/chaos/cli.ts',
  smoke: 'infra/smoke/cli.ts',
  localstack: 'infra/localstack/cli.ts',
  provisioner: 'infra/local/provisioner/cli.ts',
  'termination-storm-child': 'test/support/termination-storm-child.ts',
} as const;

export type Command = keyof typeof COMMAND_ENTRIES;
export type CommandBundles = Record<Command, string>;

/** What a file must be given: the CommonJS location names it reads but does not declare itself. */
export function undeclaredLocationNames(source: string): ('__dirname' | '__filename')[] {
  return (['__dirname', '__filename'] as const).filter(
    (name) =>
      new RegExp(`\\b${name}\\b`).test(source) &&
      !new RegExp(`\\b(var|let|const|function)\\s+${name}\\b`).test(source),
  );
}

/** How esbuild reads a source file: TypeScript for .ts, .mts and .cts, else JavaScript. */
export function loaderOf(path: string): 'ts' | 'js' {
  return /\.[cm]?ts$/.test(path) ? 'ts' : 'js';
}

/**
 * Where each loaded file is, as Node would tell it: `import.meta.url` its own URL, and `__dirname`
 * and `__filename` (CommonJS, which a dependency may use to find a file of its own, such as pino's
 * transport worker) its own folder and path, each where the file does not declare it itself.
 */
const keepFileLocation: Plugin = {
  name: 'keep-file-location',
  setup(builder) {
    builder.onLoad({ filter: /\.[cm]?[jt]s$/ }, async ({ path }) => {
      const source = await readFile(path, 'utf8');
      const usesUrl = source.includes('import.meta.url');
      const names = undeclaredLocationNames(source);
      if (!usesUrl && names.length === 0) return undefined;
      const values = { __dirname: dirname(path), __filename: path };
      const location = names.map((name) => `var ${name} = ${JSON.stringify(values[name])};\n`).join('');
      return {
        contents: location + source.replaceAll('import.meta.url', JSON.stringify(pathToFileURL(path).href)),
        loader: loaderOf(path),
      };
    });
  },
};

const BUNDLES_PREFIX = 'runtime-cleanup-test-commands-';
/** Older than any test run: a folder left by a run that was killed before its teardown. */
const ABANDONED_AFTER_MS = 24 * 60 * 60 * 1000;

async function removeAbandoned(parent: string): Promise<void> {
  for (const entry of await readdir(parent).catch(() => [])) {
    if (!entry.startsWith(BUNDLES_PREFIX)) continue;
    const folder = join(parent, entry);
    const { mtimeMs } = await stat(folder).catch(() => ({ mtimeMs: Date.now() }));
    // Another user's folder in a shared temporary folder is theirs to remove: not a reason to fail.
    if (Date.now() - mtimeMs > ABANDONED_AFTER_MS)
      await rm(folder, { recursive: true, force: true }).catch(() => {});
  }
}

/** Builds every command into `outdir` (again, after an edit: watch mode's rerun). */
async function buildInto(outdir: string): Promise<void> {
  // The operator CLI as the `runtime-cleanup-ops` bin's bundle is built (one file, no plugin): its
  // tests, some eighty starts a pass, run what an operator installs.
  await buildOpsBundle(join(outdir, 'ops.mjs'));
  const { ops: _builtAsShipped, ...split } = COMMAND_ENTRIES;
  await build({
    absWorkingDir: ROOT,
    entryPoints: split,
    outdir,
    ...NODE_COMMAND_BUNDLE,
    outExtension: { '.js': '.mjs' },
    // One copy of the modules the commands share, loaded once per start.
    splitting: true,
    plugins: [keepFileLocation],
    logLevel: 'silent',
  });
}

/**
 * Builds every command into a folder of this run's own; `rebuild` builds them again from the
 * source as it is now, `remove` deletes the folder.
 */
export async function buildCommandBundles(parent = tmpdir()): Promise<{
  bundles: CommandBundles;
  rebuild: () => Promise<void>;
  remove: () => Promise<void>;
}> {
  await removeAbandoned(parent);
  const outdir = await mkdtemp(join(parent, BUNDLES_PREFIX));
  const remove = () => rm(outdir, { recursive: true, force: true });
  try {
    await symlink(join(ROOT, 'node_modules'), join(outdir, 'node_modules'), 'dir');
    await buildInto(outdir);
  } catch (error) {
    await remove();
    throw error;
  }
  const bundles = Object.fromEntries(
    Object.keys(COMMAND_ENTRIES).map((command) => [command, join(outdir, `${command}.mjs`)]),
  ) as CommandBundles;
  return { bundles, rebuild: () => buildInto(outdir), remove };
}
