/**
 * The benchmark's memory report (bench/support/memory.ts, bench/report/): growth per cleanup over
 * the second half of the memory run, the "memory flat" target, and rendering, including results
 * files written before the post-GC samples existed (`npm run bench -- --render OLD.json`).
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import type { MemoryRun } from '../../bench/e2e/scenario.ts';
import { renderMarkdown, renderResultsSection } from '../../bench/report/markdown.ts';
import type { BenchResults } from '../../bench/report/results.ts';
import { evaluateTargets } from '../../bench/report/targets.ts';
import { type MemoryWave, memoryGrowth, slopeKiBPerCleanup } from '../../bench/support/memory.ts';

/** `waves` bursts of 200; after GC the heap and RSS are `base + perWave(i)` MiB. */
function waves(count: number, heap: (i: number) => number, rss: (i: number) => number): MemoryWave[] {
  return Array.from({ length: count }, (_, i) => ({
    cleanups: (i + 1) * 200,
    rssPeakMiB: 300,
    heapUsedPeakMiB: 150,
    afterGc: { rssMiB: rss(i), heapTotalMiB: 80, heapUsedMiB: heap(i), externalMiB: 9 },
  }));
}

function memoryRun(perWave: MemoryWave[]): MemoryRun {
  const growth = memoryGrowth(perWave);
  return {
    cleanups: perWave.at(-1)!.cleanups,
    waves: perWave.length,
    rssStartMiB: 200,
    rssPeakMiB: 210,
    rssEndMiB: 209,
    heapUsedStartMiB: 45,
    heapUsedPeakMiB: 66,
    startAfterGc: { rssMiB: 200, heapTotalMiB: 80, heapUsedMiB: 40, externalMiB: 9 },
    perWave,
    ...(growth ? { growth } : {}),
  };
}

const oldResults = (): BenchResults =>
  JSON.parse(
    readFileSync(new URL('../../bench/results/2026-11-30-quick.json', import.meta.url), 'utf8'),
  ) as BenchResults;

function memoryTarget(memory: MemoryRun) {
  const results = oldResults();
  return evaluateTargets({ ...results, e2e: { ...results.e2e!, memory } }).find(
    (t) => t.id === 'memory-flat',
  );
}

describe('growth per cleanup', () => {
  it('is the least-squares slope in KiB per cleanup', () => {
    // 1 MiB more every 1,000 cleanups: 1.024 KiB per cleanup.
    expect(slopeKiBPerCleanup([0, 1000, 2000].map((x) => ({ x, y: 40 + x / 1000 })))).toBe(1.02);
    expect(slopeKiBPerCleanup([{ x: 5, y: 1 }])).toBeUndefined();
  });

  it('is taken from the end of burst n/2 to the end of the last, leaving the filling first bursts out', () => {
    // Ten bursts: the heap jumps by 5 MiB per burst for the first four, then stays flat.
    const growth = memoryGrowth(
      waves(
        10,
        (i) => 40 + 5 * Math.min(i, 4),
        () => 200,
      ),
    )!;
    expect(growth).toMatchObject({
      fromWave: 5,
      cleanups: 1000,
      heapUsedKiBPerCleanup: 0,
      rssKiBPerCleanup: 0,
    });
    expect(
      memoryGrowth(
        waves(
          1,
          () => 40,
          () => 200,
        ),
      ),
    ).toBeUndefined();
  });
});

describe('the "memory flat" target', () => {
  it('is met when JS heap and RSS after GC grow by less than 2 KiB per cleanup', () => {
    const flat = memoryTarget(
      memoryRun(
        waves(
          10,
          (i) => 40 + 0.1 * i,
          (i) => 200 + 0.1 * i,
        ),
      ),
    );
    expect(flat?.met).toBe(true);
    // 1 MiB per burst of 200 is 5.12 KiB per cleanup: a leak.
    const leaking = memoryTarget(
      memoryRun(
        waves(
          10,
          (i) => 40 + i,
          () => 200,
        ),
      ),
    );
    expect(leaking?.met).toBe(false);
    expect(leaking?.missedBy).toContain('KiB per cleanup over');
    const rssGrowing = memoryTarget(
      memoryRun(
        waves(
          10,
          () => 40,
          (i) => 200 + i,
        ),
      ),
    );
    expect(rssGrowing?.met).toBe(false);
  });

  it('is not evaluated on too short a window, nor on results without post-GC samples', () => {
    expect(
      memoryTarget(
        memoryRun(
          waves(
            2,
            () => 40,
            () => 200,
          ),
        ),
      )?.met,
    ).toBeUndefined();
    const {
      perWave: _perWave,
      growth: _growth,
      startAfterGc: _start,
      ...old
    } = memoryRun(
      waves(
        10,
        () => 40,
        () => 200,
      ),
    );
    expect(memoryTarget(old)?.met).toBeUndefined();
  });
});

describe('rendering', () => {
  it('an old results file renders as before: one memory line, no table', () => {
    const results = oldResults();
    const lines = renderMarkdown(results, 'old.json').split('\n');
    const memory = lines.filter((line) => line.startsWith('Memory over'));
    expect(memory).toEqual([
      `Memory over 120 cleanups (2 bursts back to back at delete latency 0): RSS 184 → peak 197 → end 197 MiB; JS heap used 52.7 → peak 72.8 MiB.`,
    ]);
    expect(lines.some((line) => line.includes('after GC, cleanups done'))).toBe(false);
    expect(() => renderResultsSection(results, 'old.json')).not.toThrow();
  });

  it('new results show the post-GC figures per burst and the growth, in the docs/benchmarks.md results section too', () => {
    const results = oldResults();
    const withMemory = {
      ...results,
      e2e: {
        ...results.e2e!,
        memory: memoryRun(
          waves(
            4,
            (i) => 40 + i,
            () => 200,
          ),
        ),
      },
    };
    const section = renderResultsSection(withMemory, 'new.json');
    expect(section).toContain('| after GC, cleanups done | 0 | 200 | 400 | 600 | 800 |');
    expect(section).toContain('| JS heap used (MiB) | 40.0 | 40.0 | 41.0 | 42.0 | 43.0 |');
    expect(section).toContain(
      'Growth after GC from burst 2 to burst 4 (400 cleanups, least squares): JS heap +5.12 KiB',
    );
  });
});
