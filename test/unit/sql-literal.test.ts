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

  it.each([[Number.NaN], [Number.POSITIVE_INFINITY], ['nul\0byte'], [{}], [['array']]])(
    'refuses case %#',
    (value) => {
      expect(() => sqlLiteral(value)).toThrow(/sqlLiteral/);
    },
  );
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
