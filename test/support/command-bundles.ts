/**
 * The project's commands as the tests start them: each entry file built from this checkout's
 * source, once per test run (global-setup.ts), into one ES module per command. Node then loads the
 * project's code as one file and its dependencies from node_modules as usual, instead of tsx
 * compiling some seventy to two hundred modules at every start: about 0.9 s of CPU a start, and the
 * e2e tier starts these commands over a hundred times across its passes on a two-core machine.
 *
 * What the bundles change is how the source is loaded, never what it does: the dependencies stay
 * outside (resolved from the repository's node_modules, which is why the bundles are written under
 * it), and every source file keeps its own `import.meta.url`, so what a module reads beside itself
 * (infra/sql/, infra/migrations/) is found where it is. `npm run <command>` itself (npm, tsx) is
 * started by test/e2e/package-scripts.test.ts; the operator CLI's bin bundle by ops-cli.ts.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build, type Plugin } from 'esbuild';
import { NODE_COMMAND_BUNDLE } from '../../infra/ops/build-bundle.mjs';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Each command's entry file, as package.json's script (or the test's own child) starts it. */
export const COMMAND_ENTRIES = {
  stack: 'infra/local/stack-cli.ts',
  start: 'infra/local/demo/cli.ts',
  migrate: 'infra/migrate-cli.ts',
  ops: 'infra/ops/cli.ts',
  chaos: 'test/chaos/cli.ts',
  smoke: 'infra/smoke/cli.ts',
  provisioner: 'infra/local/provisioner/cli.ts',
  'termination-storm-child': 'test/support/termination-storm-child.ts',
} as const;

export type Command = keyof typeof COMMAND_ENTRIES;
export type CommandBundles = Record<Command, string>;

/**
 * Where each loaded file is, as Node would tell it: `import.meta.url` its own URL, and `__dirname`
 * and `__filename` (CommonJS, which a dependency may use to find a file of its own, such as pino's
 * transport worker) its own folder and path, where the file does not declare them itself.
 */
const keepFileLocation: Plugin = {
  name: 'keep-file-location',
  setup(builder) {
    builder.onLoad({ filter: /\.[cm]?[jt]s$/ }, async ({ path }) => {
      const source = await readFile(path, 'utf8');
      const usesUrl = source.includes('import.meta.url');
      const usesCommonJsLocation =
        /\b__(dirname|filename)\b/.test(source) &&
        !/\b(var|let|const|function)\s+__(dirname|filename)\b/.test(source);
      if (!usesUrl && !usesCommonJsLocation) return undefined;
      const location = usesCommonJsLocation
        ? `var __dirname = ${JSON.stringify(dirname(path))}, __filename = ${JSON.stringify(path)};\n`
        : '';
      return {
        contents: location + source.replaceAll('import.meta.url', JSON.stringify(pathToFileURL(path).href)),
        loader: path.endsWith('.ts') ? 'ts' : 'js',
      };
    });
  },
};

const BUNDLES_PREFIX = 'runtime-cleanup-test-commands-';
/** Older than any test run: a folder left by a run that was killed before its teardown. */
const ABANDONED_AFTER_MS = 24 * 60 * 60 * 1000;

async function removeAbandoned(cache: string): Promise<void> {
  for (const entry of await readdir(cache)) {
    if (!entry.startsWith(BUNDLES_PREFIX)) continue;
    const folder = join(cache, entry);
    const { mtimeMs } = await stat(folder).catch(() => ({ mtimeMs: Date.now() }));
    if (Date.now() - mtimeMs > ABANDONED_AFTER_MS) await rm(folder, { recursive: true, force: true });
  }
}

/** Builds every command into a folder of this run's own; `remove` deletes it. */
export async function buildCommandBundles(): Promise<{
  bundles: CommandBundles;
  remove: () => Promise<void>;
}> {
  const cache = join(ROOT, 'node_modules', '.cache');
  await mkdir(cache, { recursive: true });
  await removeAbandoned(cache);
  const outdir = await mkdtemp(join(cache, BUNDLES_PREFIX));
  const remove = () => rm(outdir, { recursive: true, force: true });
  try {
    await build({
      absWorkingDir: ROOT,
      entryPoints: COMMAND_ENTRIES,
      outdir,
      ...NODE_COMMAND_BUNDLE,
      outExtension: { '.js': '.mjs' },
      // One copy of the modules the commands share, loaded once per start.
      splitting: true,
      plugins: [keepFileLocation],
      logLevel: 'silent',
    });
  } catch (error) {
    await remove();
    throw error;
  }
  const bundles = Object.fromEntries(
    Object.keys(COMMAND_ENTRIES).map((command) => [command, join(outdir, `${command}.mjs`)]),
  ) as CommandBundles;
  return { bundles, remove };
}
