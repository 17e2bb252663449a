import { describe, expect, it } from 'vitest';
import { retryDelaySeconds } from '../../functions/adapters/batch.ts';
import { parseHttpDate, parseRetryAfter } from '../../functions/adapters/retry-after.ts';

/**
 * `Retry-After` from the provisioner (contract v1.1 §3): delta-seconds or any of the three
 * HTTP-date forms, as UTC; anything else counts as absent and must never throw.
 */
const NOW = Date.UTC(2026, 10, 30, 12, 0, 0);

describe('parseRetryAfter', () => {
  it('reads delta-seconds, blanks around them included', () => {
    expect(parseRetryAfter('7', NOW)).toBe(7);
    expect(parseRetryAfter(' 120 ', NOW)).toBe(120);
    expect(parseRetryAfter('0', NOW)).toBe(0);
  });

  it.each([
    ['IMF-fixdate', 'Mon, 30 Nov 2026 12:00:30 GMT'],
    ['rfc850', 'Monday, 30-Nov-26 12:00:30 GMT'],
    ['asctime', 'Mon Nov 30 12:00:30 2026'],
  ])('reads an HTTP-date in %s form as UTC: 30 s from now', (_form, value) => {
    expect(parseRetryAfter(value, NOW)).toBe(30);
  });

  it('reads an asctime day padded with a space, as UTC whatever the local time zone', () => {
    expect(parseHttpDate('Sun Nov  6 08:49:37 1994')).toBe(Date.UTC(1994, 10, 6, 8, 49, 37));
  });

  it('rounds a date up to whole seconds, so the wait is never shorter than asked', () => {
    expect(parseRetryAfter('Mon, 30 Nov 2026 12:00:30 GMT', NOW + 400)).toBe(30);
  });

  it('takes a date in the past as "now": 0 seconds', () => {
    expect(parseRetryAfter('Sun, 06 Nov 1994 08:49:37 GMT', NOW)).toBe(0);
  });

  it('returns a huge delay as it is (the caller caps it)', () => {
    expect(parseRetryAfter('99999999999999999999', NOW)).toBe(1e20);
    expect(parseRetryAfter('Fri, 31 Dec 9999 23:59:59 GMT', NOW)).toBeGreaterThan(2e11);
  });

  it.each([
    ['a negative number', '-5'],
    ['a fraction', '1.5'],
    ['an exponent', '1e3'],
    ['words', 'soon'],
    ['an empty value', ''],
    ['a date without its zone', 'Mon, 30 Nov 2026 12:00:30'],
    ['a local zone', 'Mon, 30 Nov 2026 12:00:30 CET'],
    ['an ISO timestamp', '2026-11-30T12:00:30Z'],
    ['the 31st of February', 'Sat, 31 Feb 2026 12:00:00 GMT'],
    ['hour 24', 'Mon, 30 Nov 2026 24:00:00 GMT'],
    ['a lowercase month', 'Mon, 30 nov 2026 12:00:30 GMT'],
    ['an overlong value', `${'9'.repeat(100)}`],
    ['a delta then garbage', '7; evil'],
  ])('treats %s as absent', (_name, value) => {
    expect(parseRetryAfter(value, NOW)).toBeUndefined();
  });

  it('treats a missing header, and several conflicting ones, as absent', () => {
    expect(parseRetryAfter(undefined, NOW)).toBeUndefined();
    expect(parseRetryAfter(['5', '500'], NOW)).toBeUndefined();
    expect(parseRetryAfter(['5'], NOW)).toBe(5);
  });

  it('takes linear time on a long hostile value (it is refused by length first)', () => {
    const started = performance.now();
    for (let i = 0; i < 1000; i += 1) parseRetryAfter(`Mon, ${' '.repeat(100_000)}`, NOW);
    expect(performance.now() - started).toBeLessThan(200);
  });
});

describe('retryDelaySeconds: max(backoff, Retry-After), capped by CLEANUP_RETRY_MAX_SECONDS', () => {
  const policy = { baseSeconds: 10, maxSeconds: 900 };
  const upper = () => 1; // the jitter's upper end: backoff = the capped delay itself

  it('is the backoff when nothing was asked, or less than the backoff was asked', () => {
    expect(retryDelaySeconds(1, undefined, policy, upper)).toBe(10);
    expect(retryDelaySeconds(3, 5, policy, upper)).toBe(40);
    expect(retryDelaySeconds(1, 0, policy, upper)).toBe(10);
  });

  it('waits as long as asked when that is longer than the backoff', () => {
    expect(retryDelaySeconds(1, 120, policy, upper)).toBe(120);
  });

  it('never waits beyond the cap, whatever is asked', () => {
    expect(retryDelaySeconds(1, 86_400, policy, upper)).toBe(900);
    expect(retryDelaySeconds(1, 1e20, policy, upper)).toBe(900);
  });

  it('ignores a value that is not a finite number', () => {
    expect(retryDelaySeconds(1, Number.NaN, policy, upper)).toBe(10);
    expect(retryDelaySeconds(1, Number.POSITIVE_INFINITY, policy, upper)).toBe(10);
  });
});
