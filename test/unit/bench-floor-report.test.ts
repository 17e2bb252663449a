/**
 * The benchmark's comparison with the floor (bench/e2e/, bench/report/): the median of repeated
 * bursts, and a report that says how the floor it compares with was driven, for results written
 * before the floor took the stack's batch sizes too (`npm run bench -- --render OLD.json`).
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { medianBurst } from '../../bench/e2e/median-burst.ts';
import { renderMarkdown } from '../../bench/report/markdown.ts';
import type { BenchResults } from '../../bench/report/results.ts';

const oldResults = (): BenchResults =>
  JSON.parse(
    readFileSync(new URL('../../bench/results/2026-11-30-quick.json', import.meta.url), 'utf8'),
  ) as BenchResults;

const burst = (cleanupsPerSecond: number, label = String(cleanupsPerSecond)) => ({
  cleanupsPerSecond,
  label,
});

describe('the median burst', () => {
  it('is the middle one by cleanups/s, whatever order they ran in', () => {
    expect(medianBurst([burst(150), burst(120), burst(203), burst(138), burst(160)]).cleanupsPerSecond).toBe(
      150,
    );
    expect(medianBurst([burst(90)]).cleanupsPerSecond).toBe(90);
  });

  it('is one of the bursts, with its own other figures, not a mean of them', () => {
    const chosen = medianBurst([burst(200, 'fast'), burst(100, 'slow'), burst(151, 'middle')]);
    expect(chosen.label).toBe('middle');
  });

  it('refuses an empty list or an even count (either middle one would favour one side of a ratio)', () => {
    expect(() => medianBurst([])).toThrow('no burst');
    expect(() => medianBurst([burst(1), burst(2)])).toThrow('an odd number of bursts');
  });
});

describe('the floor comparison in the report', () => {
  it('says an old result’s floor ran batches of up to 10 at every hop, and gives no spread it did not measure', () => {
    const markdown = renderMarkdown(oldResults(), 'old.json');
    expect(markdown).toContain('with batches of up to 10 at every hop and the stack’s pollers per queue');
    expect(markdown).not.toContain(' each: ');
    // One burst each (the quick run): no range either.
    const results = oldResults();
    const figures = results.e2e!.figures.map((figure) => ({
      ...figure,
      burstRepeats: { project: [120], floor: [160] },
    }));
    const quick = renderMarkdown({ ...results, e2e: { ...results.e2e!, figures } }, 'quick.json');
    expect(quick).not.toContain(' each: ');
  });

  it('names the stack’s batch sizes and every burst’s range when the result recorded them', () => {
    const results = oldResults();
    const e2e = results.e2e!;
    const figures = e2e.figures.map((figure) => ({
      ...figure,
      burstRepeats: { project: [120, 150, 138], floor: [160, 203, 170] },
    }));
    const markdown = renderMarkdown(
      { ...results, e2e: { ...e2e, floorBatchSizes: [10, 5, 10], figures } },
      'new.json',
    );
    expect(markdown).toContain('with the stack’s batch sizes (10 / 5 / 10 records) and pollers per queue');
    expect(markdown).toContain('(3 each: 120–150 vs 160–203)');
  });
});
