#!/usr/bin/env node
/**
 * `runtime-cleanup-ops <command>`: the operator CLI (infra/ops/cli.ts) from its bundle, built by
 * `npm ci` (the `prepare` script) or `npm run build:ops`. Its stdout is the command's output and
 * nothing else, unlike `npm run ops`, which prints npm's banner first. docs/ops-cli.md.
 *
 * Kept tiny: everything it does runs before every command. A missing bundle is reported, with how
 * to build it, and exit code 2 (usage or configuration: nothing was attempted).
 */
import { existsSync } from 'node:fs';
import module from 'node:module';
import { fileURLToPath } from 'node:url';

const bundle = new URL('../dist/ops.mjs', import.meta.url);

if (!existsSync(bundle)) {
  process.stderr.write(
    `runtime-cleanup-ops: the CLI's bundle ${fileURLToPath(bundle)} is missing; build it with \`npm run build:ops\` (\`npm ci\` builds it too)\n`,
  );
  process.exit(2);
}

// V8's compiled code of the 3.5 MB bundle is kept between runs (in the OS temporary directory):
// compiling it again would add about a fifth to every start (docs/ops-cli.md, section 1).
module.enableCompileCache?.();
await import(bundle.href);
