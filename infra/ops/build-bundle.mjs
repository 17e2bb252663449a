/**
 * Bundles the operator CLI (infra/ops/cli.ts) into one ES module, dist/ops.mjs, for the
 * `runtime-cleanup-ops` bin: Node loads one file instead of tsx compiling some seventy modules
 * at every start (`npm run ops -- --help` 1.5 s, the bin 0.3 s: docs/ops-cli.md, section 1).
 *
 *   node infra/ops/build-bundle.mjs [--outfile PATH]      # `npm run build:ops`; `prepare` runs it
 *
 * Plain JavaScript, so that it runs under whatever Node `npm ci` has, before anything is compiled,
 * and offline: esbuild is a pinned devDependency with its binary installed by `npm ci`.
 */
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { build } from 'esbuild';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const DEFAULT_OUTFILE = `${ROOT}dist/ops.mjs`;

/**
 * How a command and its dependencies become one ES module that Node starts: this bundle's, and the
 * bundles the tests start the other commands from (test/support/command-bundles.ts).
 */
export const NODE_COMMAND_BUNDLE = {
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node22',
  // As the functions' bundles (serverless.yml, custom.esbuild): CommonJS dependencies bundled
  // into ESM still require() Node built-ins (the AWS SDK's 'node:https', ws's 'events'), which
  // esbuild's shim refuses unless a real require exists; ES builds first, they tree-shake.
  banner: {
    js: "import { createRequire as __createRequire } from 'node:module'; const require = __createRequire(import.meta.url);",
  },
  mainFields: ['module', 'main'],
  // Not minified: it starts no faster (measured), and an operator's stack trace stays readable.
  // keepNames: error classes take their `name` from the class, which the CLI prints.
  keepNames: true,
  // node-postgres's optional native binding, never used (as for the functions).
  external: ['pg-native'],
};

export async function buildOpsBundle(outfile = DEFAULT_OUTFILE) {
  await build({
    ...NODE_COMMAND_BUNDLE,
    absWorkingDir: ROOT,
    entryPoints: ['infra/ops/cli.ts'],
    outfile,
    logLevel: 'warning',
  });
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const { values } = parseArgs({ options: { outfile: { type: 'string' } } });
  await buildOpsBundle(values.outfile ?? DEFAULT_OUTFILE);
}
