import { describe, expect, it } from 'vitest';
import { sameInstant } from '../chaos/invariants.ts';

/** The chaos checker matches a release's fence with the ledger's as instants, not as text. */
describe('sameInstant', () => {
  it('matches one instant spelled in two sessions (time zone, old and new text forms)', () => {
    expect(sameInstant('2026-11-30 16:26:29.123456+00', '2026-11-30T21:56:29.123456+05:30')).toBe(true);
    expect(sameInstant('2026-11-30T16:26:29+00:00', '2026-11-30 16:26:29+00')).toBe(true);
  });

  it('tells apart instants one microsecond apart, and a missing fence time from a present one', () => {
    expect(sameInstant('2026-11-30T16:26:29.123456+00:00', '2026-11-30T16:26:29.123457+00:00')).toBe(false);
    expect(sameInstant(null, '2026-11-30T16:26:29+00:00')).toBe(false);
    expect(sameInstant(null, null)).toBe(true);
  });
});
