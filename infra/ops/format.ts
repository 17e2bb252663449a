/**
 * Rendering helpers for the human output: aligned tables, ages, timestamps. JSON output never
 * goes through here.
 */
import { postgresTimestampMs } from '../../functions/adapters/publish.ts';

export function renderTable(headers: readonly string[], rows: ReadonlyArray<readonly string[]>): string {
  const widths = headers.map((header, column) =>
    Math.max(header.length, ...rows.map((row) => (row[column] ?? '').length)),
  );
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column]!)))
      .join('  ')
      .trimEnd();
  return [line(headers), ...rows.map(line)].join('\n');
}

/** `3d 4h`, `12m 5s`, `42s`: two units are enough to read an age at a glance. */
export function formatAge(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds)) return '-';
  const total = Math.max(0, Math.round(seconds));
  const units: Array<[string, number]> = [
    ['d', 86_400],
    ['h', 3_600],
    ['m', 60],
    ['s', 1],
  ];
  const parts: string[] = [];
  let rest = total;
  for (const [unit, size] of units) {
    const count = Math.floor(rest / size);
    rest -= count * size;
    if (count > 0 || (parts.length === 0 && unit === 's')) parts.push(`${count}${unit}`);
    if (parts.length === 2) break;
  }
  return parts.join(' ');
}

export function orDash(value: string | number | boolean | null | undefined): string {
  return value === null || value === undefined || value === '' ? '-' : String(value);
}

/** A timestamp as the database returns it (Date or text), as ISO 8601 UTC; null stays null. */
export function isoTime(value: Date | string | null | undefined): string | null {
  if (value === null || value === undefined) return null;
  const ms = value instanceof Date ? value.getTime() : Date.parse(value) || postgresTimestampMs(value);
  return Number.isFinite(ms) ? new Date(ms).toISOString() : String(value);
}

export function plural(count: number, singular: string, pluralForm = `${singular}s`): string {
  return `${count} ${count === 1 ? singular : pluralForm}`;
}
