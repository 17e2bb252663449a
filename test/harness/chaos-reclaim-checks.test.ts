/**
 * The judges of the reclaimer's fault kinds (test/chaos/reclaim-checks.ts), each fed a history that
 * keeps its property and the same history broken the way the reclaimer's bug broke it: a check
 * that could not fail would make "0 violations" meaningless.
 */
import { describe, expect, it } from 'vitest';
import { Invariant } from '../chaos/invariants.ts';
import {
  judgeLateRecords,
  judgeQuietFleet,
  judgeReusedIds,
  RECLAIM_REFUSAL_SQLSTATE,
} from '../chaos/reclaim-checks.ts';
import type { LateRecordAttempt, QuietWindow, ReusedIdAttempt } from '../chaos/reclaim-faults.ts';

describe('invariant K: a reclaimed generation is refused a record after its DELETE', () => {
  const attempt = (refusal: LateRecordAttempt['refusal']): LateRecordAttempt => ({
    sandboxId: 'sbx-leaked-late-1',
    generation: 3,
    phase: 'after-in-flight',
    settleFailedBy: 'terminated',
    msAfterDelete: 40,
    refusal,
  });

  it("the tombstone's refusal keeps it", () => {
    const refused = attempt({
      code: RECLAIM_REFUSAL_SQLSTATE,
      message: 'sandbox sbx-leaked-late-1 is being reclaimed',
    });
    expect(judgeLateRecords([refused])).toEqual({ violations: [], checked: 1 });
  });

  it('a record accepted after the statement ending the attempt failed (no tombstone: bug 3) is a violation', () => {
    const { violations, checked } = judgeLateRecords([attempt(null)]);
    expect(checked).toBe(1);
    expect(violations).toHaveLength(1);
    expect(violations[0]).toMatchObject({ invariant: Invariant.RECLAIMED_GENERATION_REFUSED });
    expect(violations[0]!.message).toMatch(
      /generation 3, deleted by the reclaimer .* was recorded again 40 ms after/,
    );
  });

  it('a refusal for another reason (a lock timeout, say) is not the tombstone: a violation', () => {
    const { violations } = judgeLateRecords([attempt({ code: '55P03', message: 'lock timeout' })]);
    expect(violations).toHaveLength(1);
    expect(violations[0]!.message).toMatch(/refused with 55P03/);
  });
});

describe('invariant Q: a quiet fleet is reclaimed within grace + two intervals', () => {
  const window = (goneAfterMs: Array<number | undefined>): QuietWindow => ({
    startedAtMs: 1_000,
    boundMs: 9_000,
    leaks: goneAfterMs.map((after, index) => ({
      sandboxId: `sbx-quiet-${index}`,
      createdAtMs: 1_000,
      goneAtMs: after === undefined ? undefined : 1_000 + after,
    })),
  });

  it('every leak gone within the bound keeps it', () => {
    expect(judgeQuietFleet([window([4_100, 6_000, 9_000])])).toEqual({ violations: [], checked: 3 });
  });

  it('brakes that refuse every quiet listing (bug 6: never reclaimed) are a violation per leak', () => {
    const { violations, checked } = judgeQuietFleet([window([undefined, undefined, 4_000])]);
    expect(checked).toBe(3);
    expect(violations.map((violation) => violation.key)).toEqual(['Q:sbx-quiet-0', 'Q:sbx-quiet-1']);
    expect(violations[0]).toMatchObject({ invariant: Invariant.QUIET_FLEET_RECLAIMED });
    expect(violations[0]!.message).toMatch(
      /never reclaimed \(bound: grace \+ two intervals \+ margin = 9000 ms\)/,
    );
  });

  it('a leak reclaimed only after the bound is a violation too', () => {
    const { violations } = judgeQuietFleet([window([9_001])]);
    expect(violations[0]!.message).toMatch(/reclaimed only after 9001 ms/);
  });
});

describe('invariant N: a reclaimed deterministic id records again within the delete window', () => {
  const attempt = (acceptedAfterMs: number | undefined, refused = 50): ReusedIdAttempt => ({
    sandboxId: 'sbx-scope-1',
    deletedAtMs: 10_000,
    acceptedAtMs: acceptedAfterMs === undefined ? undefined : 10_000 + acceptedAfterMs,
    refused,
    boundMs: 15_750,
    graceMs: 3_600_000,
  });

  it('refused while the DELETE may still act, then accepted within the window: kept', () => {
    expect(judgeReusedIds([attempt(14_500)])).toEqual({ violations: [], checked: 1 });
  });

  it('locked out for the grace (bug 7: the tombstone refused every record until it expired) is a violation', () => {
    const { violations, checked } = judgeReusedIds([attempt(3_600_000, 14_400)]);
    expect(checked).toBe(1);
    expect(violations[0]).toMatchObject({ invariant: Invariant.DETERMINISTIC_ID_RECORDABLE_AFTER_RECLAIM });
    expect(violations[0]!.message).toMatch(/recorded again only 3600000 ms after the DELETE \(14400 refusal/);
  });

  it('never accepted by the deadline is a violation', () => {
    const { violations } = judgeReusedIds([attempt(undefined)]);
    expect(violations[0]!.message).toMatch(/was never recorded again/);
  });
});
