/**
 * Rendering helpers for the human output: aligned tables, ages, timestamps, and the escaping of
 * control characters. JSON output never goes through the renderers; `safeJson` keeps it JSON.
 */
import { postgresTimestampMs } from '../../functions/adapters/publish.ts';

/**
 * Characters a terminal acts on instead of printing: C0 (ESC starts ANSI sequences that move the
 * cursor, clear the screen, retitle the window; CR and BS overwrite what was printed), DEL, C1
 * (U+009B is a one-character CSI), the Unicode line separators and the bidirectional overrides
 * (which make text read differently than it is). Run ids, reasons, actors and dead-letter
 * reasons come from the database or a queue, so from anyone who could write there.
 */
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point.
const CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point.
const CONTROL_OR_NEWLINE = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

const NAMED: Readonly<Record<string, string>> = { '\n': '\\n', '\r': '\\r', '\t': '\\t', '\b': '\\b' };

function escapeCharacter(c: string): string {
  return NAMED[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
}

/** One value on one line: every control character (line breaks included) shown as an escape. */
export function oneLine(value: string): string {
  return value.replace(CONTROL_OR_NEWLINE, escapeCharacter);
}

/**
 * A whole human-readable output: line breaks kept (the renderers put them there), every other
 * control character escaped. The CLI passes everything it prints for people through this, so no
 * renderer can forget it.
 */
export function printable(text: string): string {
  return text.replace(CONTROL, escapeCharacter);
}

/**
 * JSON.stringify escapes C0 but leaves DEL, C1 and the line separators raw: escaped here too, so
 * `--json` piped to a terminal is as harmless as the table, and still parses to the same value.
 */
export function safeJson(value: unknown): string {
  return JSON.stringify(value, null, 2).replace(
    /[\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g,
    escapeCharacter,
  );
}

/** Columns aligned; each cell is made one line first, so a value cannot break the table apart. */
export function renderTable(headers: readonly string[], cells: ReadonlyArray<readonly string[]>): string {
  const rows = cells.map((row) => row.map(oneLine));
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
