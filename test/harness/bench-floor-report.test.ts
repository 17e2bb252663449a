/**
 * The benchmark's comparison with the floor (bench/e2e/, bench/report/): the median of repeated
 * bursts, and a report that says how the floor it compares with was driven, for results written
 * before the floor took the stack's batch sizes too (`npm run bench -- --render OLD.json`).
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { medianBurst } from '../../bench/e2e/median-burst.ts';
import { Design, type LockFigure, lockVariants, VariantId } from '../../bench/locks/scenario.ts';
import { PROFILES } from '../../bench/profiles.ts';
import { renderMarkdown } from '../../bench/report/markdown.ts';
import type { BenchResults } from '../../bench/report/results.ts';
import { evaluateTargets } from '../../bench/report/targets.ts';

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

  it('is asked of every profile an odd number of times (caught here, not after minutes of bursts)', () => {
    for (const profile of Object.values(PROFILES)) {
      expect(profile.e2e.burstRepeats % 2, profile.mode).toBe(1);
    }
  });
});

describe('the floor’s row in part 1 (the lock-hold yardstick under the same load)', () => {
  /** The old quick result with part 1's floor row added, its server-side hold p99 given. */
  const withFloorRow = (splitP99: number, floorP99: number): BenchResults => {
    const results = oldResults();
    const locks = results.locks!;
    const floorVariant = lockVariants(locks.profile.scopes).find((v) => v.design === Design.FLOOR)!;
    const withP99 = (figure: LockFigure, p99: number): LockFigure => ({
      ...figure,
      serverHoldMs: { count: 640, p50: 1.5, p99, max: p99 + 2, mean: 2 },
    });
    const deployed = locks.figures.filter((f) => f.variant === VariantId.SPLIT_DEPLOYED_POOL);
    return {
      ...results,
      locks: {
        ...locks,
        variants: [...locks.variants, floorVariant],
        figures: [
          ...locks.figures.filter((f) => f.variant !== VariantId.SPLIT_DEPLOYED_POOL),
          ...deployed.map((f) => withP99(f, splitP99)),
          ...deployed.map((f) => ({
            ...withP99(f, floorP99),
            variant: floorVariant.id,
            label: floorVariant.label,
            design: Design.FLOOR,
          })),
        ],
      },
    };
  };

  it('is a variant of the deployed pool that decides nothing', () => {
    const floor = lockVariants(32).filter((v) => v.design === Design.FLOOR);
    expect(floor).toEqual([expect.objectContaining({ id: VariantId.FLOOR_DEPLOYED_POOL, connections: 5 })]);
    expect(floor[0]!.cleanupsInFlight).toBeUndefined();
  });

  it('is rendered with the split ÷ floor ratio of the hold on the server', () => {
    const markdown = renderMarkdown(withFloorRow(12, 8), 'floor.json');
    expect(markdown).toContain('| floor, pool 5 (no logic) |');
    expect(markdown).toContain(
      '*split, pool 5 (as deployed) / floor, pool 5 (no logic)* (lock hold on the server, p99) | | | ×1.50 |',
    );
    expect(markdown).toContain('The *floor* row is a lower reference for the split’s hold, not a bound');
    expect(renderMarkdown(oldResults(), 'old.json')).not.toContain('floor, pool 5');
  });

  it('is named beside the issue’s lock-hold target, which it does not judge', () => {
    const target = (results: BenchResults) =>
      evaluateTargets(results).find((evaluation) => evaluation.id === 'issue15-lock-hold-p99')!;
    const judged = target(withFloorRow(12, 8));
    expect(judged.met).toBe(false);
    expect(judged.measured).toContain('floor, pool 5 (no logic), same load, on the server p99 0: 8');
    expect(judged.measured).toContain('split ÷ floor 0: 1.5');
    expect(target(oldResults()).measured).not.toContain('floor, pool 5');
  });

  it('divides server hold by server hold, even where the target fell back to the client’s round trip', () => {
    // One split figure without a server-side hold: the target is judged on the client's round
    // trip at every latency, but the ratio to the floor must not price that trip as the split's.
    const results = withFloorRow(12, 8);
    const locks = results.locks!;
    const [first, ...rest] = locks.figures.filter((f) => f.variant === VariantId.SPLIT_DEPLOYED_POOL);
    const { serverHoldMs: _dropped, ...withoutServerHold } = first!;
    const mixed: BenchResults = {
      ...results,
      locks: {
        ...locks,
        figures: [
          ...locks.figures.filter((f) => f.variant !== VariantId.SPLIT_DEPLOYED_POOL),
          withoutServerHold,
          ...rest,
        ],
      },
    };
    const measured = evaluateTargets(mixed).find((e) => e.id === 'issue15-lock-hold-p99')!.measured;
    expect(measured).toContain('client round trip');
    expect(measured).toContain(
      `split ÷ floor ${first!.deleteLatencyMs}: —, ${rest[0]!.deleteLatencyMs}: 1.5)`,
    );
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
