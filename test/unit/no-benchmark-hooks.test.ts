/**
 * No benchmark code in the product (issue 23): what only bench/ needs lives in bench/, and every
 * Lambda ships without it. The benchmark observes the product from outside: its lock-hold clock
 * (bench/support/observed-transactions.ts, instrumented-functions.ts) wraps the adapter's
 * one-message transaction, and its baseline's old-design write is bench/baseline/clear-fence.ts.
 * A static scan of what is deployed (functions/, and the decision functions in infra/sql/) fails
 * when one of those hooks comes back; the scanner is shown to find them where they now live.
 */
import { readdir, readFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The benchmark's hooks, by the names they have in bench/, and any import of bench/ at all. */
const BENCHMARK_HOOKS: ReadonlyArray<{ name: string; pattern: RegExp }> = [
  {
    name: 'round-trip observer',
    pattern: /\b(observeRoundTrip|observedTransact|RoundTripObserver|RoundTripTiming)\b/,
  },
  { name: 'lock-hold clock', pattern: /\b(lock_taken_at|runtime_cleanup_note_lock_taken|lockHeldMs)\b/ },
  { name: 'baseline fence write', pattern: /\b(clearFence|CLEAR_FENCE)\b/ },
  { name: 'import of bench/', pattern: /\bfrom\s+['"][^'"]*\bbench\// },
];

async function filesUnder(dir: string, extension: string): Promise<string[]> {
  const entries = await readdir(join(ROOT, dir), { withFileTypes: true, recursive: true });
  return entries
    .filter((entry) => entry.isFile() && entry.name.endsWith(extension))
    .map((entry) => relative(ROOT, join(entry.parentPath, entry.name)))
    .sort();
}

/** `path:line: hook` for every line of `text` that names one. */
function hooksIn(path: string, text: string): string[] {
  return text
    .split('\n')
    .flatMap((line, index) =>
      BENCHMARK_HOOKS.filter(({ pattern }) => pattern.test(line)).map(
        ({ name }) => `${path}:${index + 1}: ${name}`,
      ),
    );
}

async function hooksUnder(dir: string, extension: string): Promise<{ files: number; found: string[] }> {
  const paths = await filesUnder(dir, extension);
  const found = await Promise.all(
    paths.map(async (path) => hooksIn(path, await readFile(join(ROOT, path), 'utf8'))),
  );
  return { files: paths.length, found: found.flat() };
}

describe('the product carries no benchmark hook', () => {
  it('functions/ names none, and imports nothing from bench/', async () => {
    const scan = await hooksUnder('functions', '.ts');
    expect(scan.files).toBeGreaterThan(40);
    expect(scan.found).toEqual([]);
  });

  it('the decision functions in infra/sql/ note no lock-taken moment (only bench/’s copies do)', async () => {
    const scan = await hooksUnder('infra/sql', '.sql');
    expect(scan.files).toBeGreaterThan(10);
    expect(scan.found).toEqual([]);
  });

  it('finds each hook where it now lives, so a clean scan means something', async () => {
    const read = (path: string) => readFile(join(ROOT, path), 'utf8');
    const observed = hooksIn('observed', await read('bench/support/observed-transactions.ts'));
    expect(observed.some((hit) => hit.endsWith('round-trip observer'))).toBe(true);
    expect(observed.some((hit) => hit.endsWith('lock-hold clock'))).toBe(true);
    const baseline = hooksIn('baseline', await read('bench/baseline/clear-fence.ts'));
    expect(baseline.some((hit) => hit.endsWith('baseline fence write'))).toBe(true);
    expect(
      hooksIn('x.ts', "import { floorCheck } from '../../bench/support/floor-transactions.ts';"),
    ).toEqual(['x.ts:1: import of bench/']);
  });
});
