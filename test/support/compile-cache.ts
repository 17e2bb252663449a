/**
 * Node's compile cache for a test run's processes (vitest.config.ts): `.cache/node-compile/` in the
 * checkout, gitignored. Node keys an entry by the compiled file's path and replaces it when the
 * file changes, but never removes one: the command bundles are built into a new temporary folder
 * each run (command-bundles.ts), so each run leaves a few megabytes of entries no later run can
 * use. Past ENTRY_LIMIT entries the folder is emptied before the run, which then fills it again
 * (a merged run from an empty cache wrote 9,233, about 45 MB).
 */
import { readdirSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const COMPILE_CACHE_DIR = fileURLToPath(new URL('../../.cache/node-compile/', import.meta.url));
const ENTRY_LIMIT = 25_000;

/** The cache folder, emptied first if it holds more than `limit` entries. */
export function compileCacheDir(dir: string = COMPILE_CACHE_DIR, limit: number = ENTRY_LIMIT): string {
  if (countEntries(dir) > limit) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // Another run of this checkout writing into it, or not ours to remove: a cache too large is
      // no reason to stop a run; the next one prunes it.
    }
  }
  return dir;
}

/** Entries of every Node version's and user's subfolder (`v22.23.3-x64-…-<uid>/`). */
function countEntries(dir: string): number {
  let entries = 0;
  try {
    for (const sub of readdirSync(dir, { withFileTypes: true })) {
      if (sub.isDirectory()) entries += readdirSync(`${dir}/${sub.name}`).length;
    }
  } catch {
    // No cache yet, or not ours to read: nothing to prune.
  }
  return entries;
}
