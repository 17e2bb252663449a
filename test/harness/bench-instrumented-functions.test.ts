/**
 * The benchmark's instrumented copies (bench/support/instrumented-functions.ts) are the product's
 * function files with one note call after each scope-lock line and nothing else, so a benchmark
 * measures the product's current decisions.
 */
import { describe, expect, it } from 'vitest';
import { instrumentedCopy, MEASURED_FUNCTIONS } from '../../bench/support/instrumented-functions.ts';
import { loadFunctionFiles } from '../../infra/migrate.ts';

const NOTE = 'PERFORM runtime_cleanup_note_lock_taken();';

describe('the instrumented copies', () => {
  it('add one note after each scope-lock line of the measured functions, and change nothing else', async () => {
    const files = await loadFunctionFiles();
    const copied = files.flatMap((file) => {
      const copy = instrumentedCopy(file);
      return copy === undefined ? [] : [{ file, copy }];
    });
    expect(copied.map(({ file }) => file.name)).toEqual(expect.arrayContaining([...MEASURED_FUNCTIONS]));
    for (const { file, copy } of copied) {
      const lines = copy.split('\n');
      const notes = lines.flatMap((line, index) => (line.trim() === NOTE ? [index] : []));
      expect(notes.length, file.name).toBeGreaterThan(0);
      for (const index of notes) {
        expect(lines[index - 1], file.name).toMatch(
          /PERFORM pg_advisory_xact_lock\(runtime_cleanup_lock_key\(/,
        );
      }
      expect(lines.filter((line) => line.trim() !== NOTE).join('\n'), file.name).toBe(file.sql);
    }
    // The product's own files never note anything.
    for (const file of files) expect(file.sql, file.name).not.toContain('runtime_cleanup_note_lock_taken');
  });

  it('leaves a file without a scope lock alone', () => {
    expect(instrumentedCopy({ name: 'f', sql: 'CREATE FUNCTION f() …', checksum: '' })).toBeUndefined();
  });
});
