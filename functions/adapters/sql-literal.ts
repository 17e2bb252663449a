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

/** One value as a SQL literal: null, a finite number, a boolean, a bigint, a Date or a string. */
export function sqlLiteral(value: unknown): string {
  if (value === null || value === undefined) return 'NULL';
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

/** node-postgres's escapeLiteral: correct under either setting of standard_conforming_strings. */
function escapeLiteral(text: string): string {
  const quoted = text.replaceAll("'", "''");
  return text.includes('\\') ? ` E'${quoted.replaceAll('\\', '\\\\')}'` : `'${quoted}'`;
}
