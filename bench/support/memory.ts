/**
 * Memory of the benchmark's process after a forced full garbage collection, and the growth per
 * cleanup across waves of work. A peak says how high memory went while the work ran (garbage
 * included); only what survives a full GC says whether something is retained, and only the trend
 * over several waves tells a plateau (the heap and the allocator settle at a high-water mark)
 * from a leak (every cleanup leaves something behind).
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

export interface MemorySample {
  rssMiB: number;
  /** What V8 has committed for the JS heap: it keeps pages after a collection, for the next peak. */
  heapTotalMiB: number;
  heapUsedMiB: number;
  /** Memory of C++ objects bound to JS objects (buffers, sockets' native state). */
  externalMiB: number;
}

/** One wave of the memory run (bench/e2e/scenario.ts). */
export interface MemoryWave {
  /** Cleanups done so far, this wave's included. */
  cleanups: number;
  /** The highest RSS and JS heap sampled while the wave ran: garbage not yet collected included. */
  rssPeakMiB: number;
  heapUsedPeakMiB: number;
  /** After a forced full GC at the end of the wave: what the wave left behind. */
  afterGc: MemorySample;
}

/**
 * Growth per cleanup of what survives a full GC, over the second half of the run: from the end of
 * wave `fromWave` to the end of the last. The first waves are left out because they fill what is
 * filled once (JIT code, connection pools, caches); what still grows after that grows with the
 * work.
 */
export interface MemoryGrowth {
  fromWave: number;
  /** Cleanups in the window. */
  cleanups: number;
  /** Least-squares slopes of the post-GC samples, KiB per cleanup; undefined below two samples. */
  heapUsedKiBPerCleanup: number | undefined;
  rssKiBPerCleanup: number | undefined;
}

const mib = (bytes: number) => Math.round((bytes / 2 ** 20) * 10) / 10;

let collect: (() => void) | undefined;

/**
 * `global.gc`, which `npm run bench` exposes (`--expose-gc` in its NODE_OPTIONS). Started another
 * way (`npx tsx bench/run.ts`), the flag is set at run time and the function taken from a fresh
 * context, as Jest's leak detector does: only then does V8 create `gc` on a new global.
 */
function gcFunction(): () => void {
  if (collect) return collect;
  const exposed = (globalThis as { gc?: () => void }).gc;
  if (exposed) collect = exposed;
  else {
    setFlagsFromString('--expose-gc');
    collect = runInNewContext('gc') as () => void;
  }
  return collect;
}

/**
 * Full collections until the heap stops shrinking (at most 4): one pass can leave garbage that
 * only becomes unreachable once finalizers and weak callbacks of the previous pass have run.
 */
export async function sampleAfterGc(): Promise<MemorySample> {
  const gc = gcFunction();
  let previous = Number.POSITIVE_INFINITY;
  for (let pass = 0; pass < 4; pass += 1) {
    gc();
    // Lets pending finalization callbacks and closed handles run before the next pass.
    await new Promise((resolve) => setImmediate(resolve));
    const used = process.memoryUsage().heapUsed;
    if (used >= previous * 0.995) break;
    previous = used;
  }
  const usage = process.memoryUsage();
  return {
    rssMiB: mib(usage.rss),
    heapTotalMiB: mib(usage.heapTotal),
    heapUsedMiB: mib(usage.heapUsed),
    externalMiB: mib(usage.external),
  };
}

/**
 * Least-squares slope of `y` (MiB) against `x` (cleanups), in KiB per cleanup; undefined with
 * fewer than two points or no spread in `x`.
 */
export function slopeKiBPerCleanup(points: ReadonlyArray<{ x: number; y: number }>): number | undefined {
  if (points.length < 2) return undefined;
  const meanX = points.reduce((sum, p) => sum + p.x, 0) / points.length;
  const meanY = points.reduce((sum, p) => sum + p.y, 0) / points.length;
  let covariance = 0;
  let variance = 0;
  for (const p of points) {
    covariance += (p.x - meanX) * (p.y - meanY);
    variance += (p.x - meanX) ** 2;
  }
  if (variance === 0) return undefined;
  return Math.round((covariance / variance) * 1024 * 100) / 100;
}

/** The growth over the second half of `waves` (1-based `fromWave`); undefined with fewer than two waves. */
export function memoryGrowth(waves: readonly MemoryWave[]): MemoryGrowth | undefined {
  if (waves.length < 2) return undefined;
  const fromWave = Math.max(1, Math.floor(waves.length / 2));
  const window = waves.slice(fromWave - 1);
  const series = (pick: (sample: MemorySample) => number) =>
    slopeKiBPerCleanup(window.map((wave) => ({ x: wave.cleanups, y: pick(wave.afterGc) })));
  return {
    fromWave,
    cleanups: window.at(-1)!.cleanups - window[0]!.cleanups,
    heapUsedKiBPerCleanup: series((sample) => sample.heapUsedMiB),
    rssKiBPerCleanup: series((sample) => sample.rssMiB),
  };
}
