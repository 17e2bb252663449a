import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';

/**
 * `engines.node` must promise no less than the dependencies need. The deployed code runs on
 * Lambda's nodejs22.x, whatever its 22 minor: every package the bundles may contain must accept
 * every Node 22 from our declared minimum on (undici 8, for one, refuses anything below 22.19).
 * The tooling runs on the pinned `node` devDependency, which every dev package must accept.
 * Read from package-lock.json, which records each package's engines: no network, no install.
 */
type Version = [number, number, number];

function parseVersion(text: string): Version {
  const match = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$/.exec(text.trim());
  if (!match) throw new Error(`not a version: "${text}"`);
  return [Number(match[1]), Number(match[2] ?? 0), Number(match[3] ?? 0)];
}

function compare(a: Version, b: Version): number {
  for (let i = 0; i < 3; i += 1) if (a[i] !== b[i]) return a[i]! - b[i]!;
  return 0;
}

/** One comparator of a range (the forms npm packages use in `engines`); unknown forms are refused. */
function satisfiesComparator(version: Version, comparator: string): boolean {
  const match = /^(>=|<=|>|<|=|\^|~)?\s*v?([\d.x*]+)$/.exec(comparator);
  if (!match) throw new Error(`unsupported engines comparator "${comparator}"`);
  const [, operator = '', raw] = match;
  const parts = raw!.split('.');
  const wildcard = parts.findIndex((part) => part === 'x' || part === '*');
  const given = wildcard === -1 ? parts.length : wildcard;
  const bound = parseVersion(parts.slice(0, given).join('.') || '0');
  const majorOnly = given === 1;
  switch (operator) {
    case '>=':
      return compare(version, bound) >= 0;
    case '>':
      return compare(version, bound) > 0;
    case '<=':
      return compare(version, bound) <= 0;
    case '<':
      return compare(version, bound) < 0;
    case '^':
      return compare(version, bound) >= 0 && version[0] === bound[0];
    case '~':
      return (
        compare(version, bound) >= 0 && version[0] === bound[0] && (majorOnly || version[1] === bound[1])
      );
    default:
      // `22`, `22.x`, `=22.1.0`: the same major (and minor, patch where given).
      return parts.slice(0, given).every((part, index) => Number(part) === version[index]);
  }
}

function satisfies(version: Version, range: string): boolean {
  return range.split('||').some((alternative) => {
    const comparators = alternative
      .trim()
      .replace(/(>=|<=|>|<|=|\^|~)\s+/g, '$1')
      .split(/\s+/)
      .filter(Boolean);
    return comparators.every((comparator) => satisfiesComparator(version, comparator));
  });
}

interface LockPackage {
  dev?: boolean;
  engines?: { node?: string } | string[];
}

async function project() {
  const pkg = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as {
    engines: { node: string };
    devDependencies: Record<string, string>;
  };
  const lock = JSON.parse(await readFile(new URL('../../package-lock.json', import.meta.url), 'utf8')) as {
    packages: Record<string, LockPackage>;
  };
  return { pkg, lock };
}

const nodeRange = (entry: LockPackage) =>
  !Array.isArray(entry.engines) && typeof entry.engines?.node === 'string' ? entry.engines.node : undefined;

describe('engines.node', () => {
  it('is a minimum on the Node 22 line that every production package accepts, up to the last 22', async () => {
    const { pkg, lock } = await project();
    const minimum = /^>=\s*(\d+(?:\.\d+){0,2})$/.exec(pkg.engines.node)?.[1];
    expect(minimum, 'engines.node is a plain ">=" minimum').toBeDefined();
    const floor = parseVersion(minimum!);
    expect(floor[0]).toBe(22);
    // The lock's own copy of it (npm writes it there) says the same.
    expect(lock.packages['']?.engines).toEqual(pkg.engines);
    const checked: string[] = [];
    const refused: string[] = [];
    for (const [path, entry] of Object.entries(lock.packages)) {
      const range = nodeRange(entry);
      if (!path || entry.dev || !range) continue;
      checked.push(path);
      for (const version of [floor, [22, 99, 99] as Version]) {
        if (!satisfies(version, range)) refused.push(`${path} (${range}) refuses ${version.join('.')}`);
      }
    }
    expect(checked).toContain('node_modules/undici');
    expect(refused).toEqual([]);
  });

  it('would be refused below what undici needs (the check sees a too-low minimum)', async () => {
    const { lock } = await project();
    const undici = nodeRange(lock.packages['node_modules/undici']!)!;
    expect(satisfies(parseVersion('22.15.0'), undici)).toBe(false);
    expect(satisfies(parseVersion('22.19.0'), undici)).toBe(true);
  });

  it('is accepted by every dev package on the pinned Node the tooling runs on', async () => {
    const { pkg, lock } = await project();
    const pinned = parseVersion(pkg.devDependencies.node!);
    expect(satisfies(pinned, pkg.engines.node)).toBe(true);
    const refused = Object.entries(lock.packages)
      .filter(([path, entry]) => path && entry.dev && nodeRange(entry))
      .filter(([, entry]) => !satisfies(pinned, nodeRange(entry)!))
      .map(([path, entry]) => `${path} (${nodeRange(entry)})`);
    expect(refused).toEqual([]);
  });
});
