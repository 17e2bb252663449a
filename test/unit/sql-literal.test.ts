import { describe, expect, it } from 'vitest';
import { inlineParameters, sqlLiteral } from '../../functions/adapters/sql-literal.ts';

describe('sqlLiteral', () => {
  it.each([
    [null, 'NULL'],
    [undefined, 'NULL'],
    [42, '(42)'],
    [-1, '(-1)'],
    [2.5, '(2.5)'],
    [10n, '(10)'],
    [true, 'TRUE'],
    [false, 'FALSE'],
    ['run-1', "'run-1'"],
    ["it's", "'it''s'"],
    ["a\\'; DROP TABLE agent_runs; --", " E'a\\\\''; DROP TABLE agent_runs; --'"],
    [new Date('2026-01-02T03:04:05.678Z'), "'2026-01-02T03:04:05.678Z'"],
  ])('%# → %s', (value, literal) => {
    expect(sqlLiteral(value)).toBe(literal);
  });

  it.each([
    [[], "'{}'"],
    [['a', 'b'], `'{"a","b"}'`],
    [[1, null, 2n], `'{"1",NULL,"2"}'`],
    [[true, false], `'{"true","false"}'`],
    [[new Date('2026-01-02T03:04:05.678Z')], `'{"2026-01-02T03:04:05.678Z"}'`],
    // A string that reads as NULL, a comma or braces stays one element: every element is quoted.
    [['NULL', 'a,b', '{c}', ''], `'{"NULL","a,b","{c}",""}'`],
    // A quote inside an element: the array syntax's backslash before it, which makes the whole an
    // E'' literal with that backslash doubled.
    [['say "hi"'], String.raw` E'{"say \\"hi\\""}'`],
    [["it's"], `'{"it''s"}'`],
  ])('array %# → %s', (value, literal) => {
    expect(sqlLiteral(value)).toBe(literal);
  });

  it('escapes a backslash in an array element for the array syntax and then for the literal', () => {
    // Element a\b: the array text is {"a\\b"}, whose backslashes E'' doubles once more.
    expect(sqlLiteral([String.raw`a\b`])).toBe(String.raw` E'{"a\\\\b"}'`);
  });

  it.each([
    [Number.NaN],
    [Number.POSITIVE_INFINITY],
    ['nul\0byte'],
    [{}],
    [[['nested']]],
    [[{}]],
    [[Number.NaN]],
    [['nul\0byte']],
  ])('refuses case %#', (value) => {
    expect(() => sqlLiteral(value)).toThrow(/sqlLiteral/);
  });
});

describe('inlineParameters', () => {
  it('replaces each placeholder by its value, casts kept', () => {
    expect(inlineParameters('SELECT f($1::text, $2::bigint, $1::text)', ["o'k", 7])).toBe(
      "SELECT f('o''k'::text, (7)::bigint, 'o''k'::text)",
    );
  });

  it('refuses a placeholder without a value and a dollar that is not a placeholder', () => {
    expect(() => inlineParameters('SELECT $2::text', ['only one'])).toThrow(/\$2 has no value/);
    expect(() => inlineParameters('SELECT $$x$$', [])).toThrow(/not a placeholder/);
  });
});
