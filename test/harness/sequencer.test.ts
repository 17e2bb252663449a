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
      [file('s1', 1), file('long20', 20), file('s2', 2), file('long60', 60), file('s3', 1), file('long9', 9)],
      2,
    );
    expect(order).toEqual(['long60', 'long20', 'long9', 's1', 's2', 's3']);
  });

  it('places a file that waits for a lock another long file holds where the lock comes free, short files filling the gap', () => {
    const order = scheduleLongFirst(
      [
        file('engineA', 40, 'engine'),
        file('engineB', 40, 'engine'),
        file('other', 10),
        ...Array.from({ length: 30 }, (_, index) => file(`s${index}`, 2)),
      ],
      2,
    );
    // engineA and other start at 0; the second worker then takes short files until engineA ends.
    expect(order.slice(0, 2)).toEqual(['engineA', 'other']);
    const engineB = order.indexOf('engineB');
    // 10 s of `other` and then 2 s files on one worker until 40 s: 15 short files before it.
    expect(order.slice(2, engineB)).toEqual(Array.from({ length: 15 }, (_, index) => `s${index}`));
    expect(new Set(order).size).toBe(33);
  });

  it('waits for the lock when nothing else is left to run', () => {
    expect(scheduleLongFirst([file('a', 30, 'engine'), file('b', 20, 'engine')], 4)).toEqual(['a', 'b']);
  });

  it('changes only the order: every file once, short ones included, with any number of workers', () => {
    const files = Array.from({ length: 50 }, (_, index) =>
      file(`f${index}`, (index * 7) % 23, index % 5 === 0 ? 'engine' : undefined),
    );
    for (const workers of [0, 1, 2, 4, 16]) {
      expect([...scheduleLongFirst(files, workers)].sort()).toEqual(files.map((entry) => entry.item).sort());
    }
  });

  it('knows the chaos engine lock by the call that takes it', () => {
    expect(FILE_LONG_LOCKS['chaos engine']?.test('result = await oneEngineAtATime(() => {')).toBe(true);
    expect(LONG_FILE_SECONDS).toBeGreaterThan(0);
  });
});
