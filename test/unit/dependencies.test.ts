/**
 * The Powertools packages are released together and share @aws-lambda-powertools/commons: two
 * versions side by side put two copies of commons in every bundle (logger and metrics at 2.36.0
 * beside batch at 2.35.0 did), each with its own idea of the invocation's context.
 */
import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';

const root = new URL('../../', import.meta.url);
const json = async (file: string) => JSON.parse(await readFile(new URL(file, root), 'utf8'));

describe('Powertools for AWS Lambda', () => {
  it('every package is pinned to one and the same version', async () => {
    const manifest = await json('package.json');
    const powertools = Object.entries({ ...manifest.dependencies, ...manifest.devDependencies }).filter(
      ([name]) => name.startsWith('@aws-lambda-powertools/'),
    );
    expect(powertools.length).toBeGreaterThanOrEqual(3);
    expect(new Set(powertools.map(([, version]) => version)).size, JSON.stringify(powertools)).toBe(1);
    for (const [, version] of powertools) expect(version).toMatch(/^\d+\.\d+\.\d+$/);
  });

  it('the lockfile installs one copy of their shared commons package', async () => {
    const lock = await json('package-lock.json');
    const commons = Object.entries(lock.packages as Record<string, { version: string }>)
      .filter(([path]) => path.endsWith('node_modules/@aws-lambda-powertools/commons'))
      .map(([, entry]) => entry.version);
    expect(commons).toHaveLength(1);
  });
});
