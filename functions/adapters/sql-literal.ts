/**
 * Inlines parameters into a statement as SQL literals, for the one-round-trip transaction
 * (`Database.transact`): the simple-query protocol that carries BEGIN, the SET LOCALs, the
 * statement and COMMIT in one message takes no parameters.
 *
 * Strings are escaped as node-postgres's `escapeLiteral` does (quotes doubled; with a backslash,
 * an E'' literal with the backslashes doubled), so the literal means the same under either setting of
 * standard_conforming_strings. Only the protocol's own statements are inlined, and their text is
 * checked: every `$` must start a placeholder `$n` that has a value, so a dollar quote or a
 * placeholder without its value is refused instead of being half-substituted.
 */
export function inlineParameters(text: string, values: readonly unknown[] = []): string {
  const stray = /\$(?!\d)/.exec(text);
  if (stray) throw new Error(`inlineParameters: "$" at ${stray.index} is not a placeholder`);
  return text.replace(/\$(\d+)/g, (_, digits: string) => {
    const index = Number(digits) - 1;
    if (index < 0 || index >= values.length) {
      throw new Error(`inlineParameters: $${digits} has no value (${values.length} given)`);
    }
    return sqlLiteral(values[index]);
  });
}

/**
 * One value as a SQL literal: null, a finite number, a boolean, a bigint, a Date, a string, or a
 * flat array of those (the bookkeeping's `unnest($1::text[], $2::bigint[], …)` and `= ANY ($1::text[])`).
 */
export function sqlLiteral(value: unknown): string {
  if (value === null || value === undefined) return 'NULL';
  if (Array.isArray(value)) return escapeLiteral(arrayText(value));
  switch (typeof value) {
    case 'number':
      if (!Number.isFinite(value)) throw new Error(`sqlLiteral: ${value} is not a finite number`);
      // Parenthesised: `$1::bigint` with -1 must read (-1)::bigint.
      return `(${String(value)})`;
    case 'bigint':
      return `(${value.toString()})`;
    case 'boolean':
      return value ? 'TRUE' : 'FALSE';
    case 'string':
      // The simple-query message is NUL-terminated: a NUL would cut the statement short.
      if (value.includes('\0')) throw new Error('sqlLiteral: a string value contains NUL');
      return escapeLiteral(value);
    default:
      if (value instanceof Date) return escapeLiteral(value.toISOString());
      throw new Error(`sqlLiteral: cannot inline a ${typeof value}`);
  }
}

/**
 * A flat array in PostgreSQL's array input syntax, as node-postgres sends an array parameter
 * (`'{"a",NULL,"b"}'`), so `$1::text[]` inlined reads what the bound parameter read: an untyped
 * literal that the statement's own cast types, an empty array included (`'{}'`). Every element
 * but NULL is double-quoted (so "NULL", a comma or a brace inside a string stays data), with `"`
 * and `\` backslash-escaped as the array syntax wants; the whole text is then one ordinary string
 * literal. Nested arrays are refused: no statement sends one, and their dimensions must agree.
 */
function arrayText(values: readonly unknown[]): string {
  const elements = values.map((element) => {
    if (element === null || element === undefined) return 'NULL';
    if (Array.isArray(element)) throw new Error('sqlLiteral: cannot inline a nested array');
    const text = arrayElementText(element);
    if (text.includes('\0')) throw new Error('sqlLiteral: an array element contains NUL');
    return `"${text.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`;
  });
  return `{${elements.join(',')}}`;
}

/** One array element's text, for the scalar kinds sqlLiteral takes. */
function arrayElementText(element: unknown): string {
  switch (typeof element) {
    case 'number':
      if (!Number.isFinite(element)) throw new Error(`sqlLiteral: ${element} is not a finite number`);
      return String(element);
    case 'bigint':
      return element.toString();
    case 'boolean':
      return element ? 'true' : 'false';
    case 'string':
      return element;
    default:
      if (element instanceof Date) return element.toISOString();
      throw new Error(`sqlLiteral: cannot inline a ${typeof element} in an array`);
  }
}

/** node-postgres's escapeLiteral: correct under either setting of standard_conforming_strings. */
function escapeLiteral(text: string): string {
  const quoted = text.replaceAll("'", "''");
  return text.includes('\\') ? ` E'${quoted.replaceAll('\\', '\\\\')}'` : `'${quoted}'`;
}
