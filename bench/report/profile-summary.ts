/**
 * `npx tsx bench/report/profile-summary.ts FILE.cpuprofile [--top N]`: self time of a V8 CPU
 * profile (`node --cpu-prof`) grouped by where the code lives (a package under node_modules, a
 * folder of this repository, node's own internals, GC, idle), and the top functions by self time.
 * Markdown on stdout; bench/results/profile-summary.md is made from it.
 */
import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}

interface Profile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** Where a frame's code lives, coarse enough to act on. */
export function placeOf(url: string, functionName: string): string {
  if (functionName === '(garbage collector)') return '(garbage collector)';
  if (functionName === '(idle)') return '(idle)';
  if (functionName === '(program)') return '(program: V8 and native code)';
  if (!url) return '(native)';
  const modules = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (modules) return modules[1]!;
  if (url.startsWith('node:')) return `node:${url.slice(5).split('/')[0]}`;
  const repo = /\/(functions|infra|bench|test)\/([^/]+)/.exec(url);
  if (repo) return `${repo[1]}/${repo[2]}`;
  return url;
}

export function summarizeProfile(profile: Profile, top = 25): string {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const selfMs = new Map<number, number>();
  profile.samples.forEach((id, index) => {
    selfMs.set(id, (selfMs.get(id) ?? 0) + (profile.timeDeltas[index] ?? 0) / 1000);
  });
  const total = [...selfMs.values()].reduce((sum, ms) => sum + ms, 0);
  // Idle time, and the profiler's own work (the inspector call that stops it), are not the code's.
  const notCode = (node: ProfileNode | undefined) =>
    node?.callFrame.functionName === '(idle)' || node?.callFrame.url === 'node:inspector';
  const idle = [...selfMs.entries()]
    .filter(([id]) => notCode(byId.get(id)))
    .reduce((sum, [, ms]) => sum + ms, 0);
  const busy = total - idle;
  const places = new Map<string, number>();
  const functions = new Map<string, number>();
  for (const [id, ms] of selfMs) {
    const node = byId.get(id)!;
    const { functionName, url, lineNumber } = node.callFrame;
    if (notCode(node)) continue;
    const place = placeOf(url, functionName);
    places.set(place, (places.get(place) ?? 0) + ms);
    const name = `${functionName || '(anonymous)'} — ${place}${url && !url.startsWith('node:') ? `:${lineNumber + 1}` : ''}`;
    functions.set(name, (functions.get(name) ?? 0) + ms);
  }
  const pct = (ms: number) => `${((ms / busy) * 100).toFixed(1)}%`;
  const rows = (map: Map<string, number>, limit: number) =>
    [...map.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, limit)
      .map(([name, ms]) => `| ${name.replaceAll('|', '\\|')} | ${ms.toFixed(0)} | ${pct(ms)} |`);
  return [
    `Profile of ${((profile.endTime - profile.startTime) / 1e6).toFixed(1)} s: ${busy.toFixed(0)} ms on CPU (idle and the profiler's own stop excluded), shares of that below.`,
    '',
    '| where (self time) | ms | share |',
    '|---|---:|---:|',
    ...rows(places, top),
    '',
    '| function (self time) | ms | share |',
    '|---|---:|---:|',
    ...rows(functions, top),
    '',
  ].join('\n');
}

async function main(): Promise<void> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: { top: { type: 'string', default: '25' } },
  });
  const file = positionals[0];
  if (!file) throw new Error('usage: profile-summary.ts FILE.cpuprofile [--top N]');
  const profile = JSON.parse(await readFile(file, 'utf8')) as Profile;
  process.stdout.write(summarizeProfile(profile, Number(values.top)));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((error: unknown) => {
    process.stderr.write(`${(error as Error).message}\n`);
    process.exit(1);
  });
}
