/**
 * The tests' command bundles (test/support/command-bundles.ts) keep each file's location: what the
 * plugin gives a file, and how it reads it.
 */
import { describe, expect, it } from 'vitest';
import { loaderOf, undeclaredLocationNames } from '../support/command-bundles.ts';

describe('the command bundles keep each file where it is', () => {
  it('gives a file each CommonJS location name it reads and does not declare, on its own', () => {
    expect(undeclaredLocationNames('join(__dirname, "worker.js")')).toEqual(['__dirname']);
    expect(undeclaredLocationNames('const self = __filename; join(__dirname, "x")')).toEqual([
      '__dirname',
      '__filename',
    ]);
    // Declaring one of them is no reason to withhold the other (pino's transport reads both).
    expect(
      undeclaredLocationNames('const __filename = fileURLToPath(import.meta.url); join(__dirname, "x")'),
    ).toEqual(['__dirname']);
    expect(undeclaredLocationNames('var __dirname = "/x"; __dirname')).toEqual([]);
    expect(undeclaredLocationNames('const dirname_ = 1; my__dirname')).toEqual([]);
  });

  it('reads .ts, .mts and .cts as TypeScript and the rest as JavaScript', () => {
    expect(['a.ts', 'a.mts', 'a.cts'].map(loaderOf)).toEqual(['ts', 'ts', 'ts']);
    expect(['a.js', 'a.mjs', 'a.cjs'].map(loaderOf)).toEqual(['js', 'js', 'js']);
  });
});
