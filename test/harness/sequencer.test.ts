import { describe, expect, it } from 'vitest';
import {
  FILE_LONG_LOCKS,
  LONG_FILE_SECONDS,
  type ScheduledFile,
  scheduleLongFirst,
} from '../support/sequencer.ts';

const file = (item: string, seconds: number, lock?: string): ScheduledFile<string> => ({
  item,
  seconds,
  lock,
});

describe('scheduleLongFirst', () => {
  it('hands out the long files first, longest first, then the short ones in their given order', () => {
    const order = scheduleLongFirst(
      [
        file('s1', 1),
        file('long20', 20),
        file('s2', 2),
        file('long60', 60),
        file('s3', 1),
        file('long30', 30),
      ],
      2,
    );
    expect(order).toEqual(['long60', 'long30', 'long20', 's1', 's2', 's3']);
  });

  it('places a file that waits for a lock another long file holds where the lock comes free, short files filling the gap', () => {
    const order = scheduleLongFirst(
      [
        file('packagingA', 40, 'packaging'),
        file('packagingB', 40, 'packaging'),
        file('other', 10),
        ...Array.from({ length: 30 }, (_, index) => file(`s${index}`, 2)),
      ],
      2,
    );
    // packagingA and other start at 0; the second worker then takes short files until packagingA ends.
    expect(order.slice(0, 2)).toEqual(['packagingA', 'other']);
    const packagingB = order.indexOf('packagingB');
    // 10 s of `other` and then 2 s files on one worker until 40 s: 15 short files before it.
    expect(order.slice(2, packagingB)).toEqual(Array.from({ length: 15 }, (_, index) => `s${index}`));
    expect(new Set(order).size).toBe(33);
  });

  it('starts the copies of one file (its database passes) apart, other long files and short ones between them', () => {
    const copy = (item: string, seconds: number): ScheduledFile<string> => ({
      item,
      seconds,
      lock: undefined,
      path: 'test/e2e/demo.test.ts',
    });
    const order = scheduleLongFirst(
      [
        copy('demo', 50),
        copy('demo-tcp', 50),
        copy('demo-pgbouncer', 50),
        file('packaging', 40),
        file('other', 30),
        ...Array.from({ length: 40 }, (_, index) => file(`s${index}`, 1)),
      ],
      3,
    );
    // One demo at 0, beside the other long files; the third worker fills with short files until
    // the first demo ends at 50 s, after `other` (30 s) and `packaging` (40 s) on the others.
    expect(order.slice(0, 3)).toEqual(['demo', 'packaging', 'other']);
    expect(order.indexOf('demo-tcp')).toBeGreaterThan(order.indexOf('s9'));
    expect(order.indexOf('demo-pgbouncer')).toBeGreaterThan(order.indexOf('demo-tcp'));
    expect(new Set(order).size).toBe(45);
  });

  it('still starts copies side by side when nothing else is left to run', () => {
    const copies = ['a', 'b'].map((item) => ({ item, seconds: 30, lock: undefined, path: 'same.test.ts' }));
    expect(scheduleLongFirst(copies, 2)).toEqual(['a', 'b']);
  });

  it('waits for the lock when nothing else is left to run', () => {
    expect(scheduleLongFirst([file('a', 30, 'packaging'), file('b', 20, 'packaging')], 4)).toEqual([
      'a',
      'b',
    ]);
  });

  it('changes only the order: every file once, short ones included, with any number of workers', () => {
    const files = Array.from({ length: 50 }, (_, index) =>
      file(`f${index}`, (index * 7) % 23, index % 5 === 0 ? 'packaging' : undefined),
    );
    for (const workers of [0, 1, 2, 4, 16]) {
      expect([...scheduleLongFirst(files, workers)].sort()).toEqual(files.map((entry) => entry.item).sort());
    }
  });

  it('knows the packaging lock and the chaos engine lock by the calls that take them', () => {
    expect(FILE_LONG_LOCKS.packaging?.test('const packaged = await packageService({')).toBe(true);
    expect(
      FILE_LONG_LOCKS.chaosEngine?.test("result = await runCoverageCycleInTurn('chaos.test.ts', {"),
    ).toBe(true);
    expect(LONG_FILE_SECONDS).toBeGreaterThan(0);
  });
});
