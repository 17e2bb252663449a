/**
 * The provisioner's listing as the reclaimer reads it (contract v1.1 section 3), and the share
 * rule: what is accepted, and what refuses a whole reclaim run with which reason.
 */
import { describe, expect, it } from 'vitest';
import {
  checkBrakes,
  PAIRING_EVIDENCE_MAX_AGE_SECONDS,
  SHARE_RULE_ALLOWANCE,
} from '../../functions/cleanup/reclaim.ts';
import {
  parseSandboxListing,
  ReclaimRefusal,
  ReclaimRefusedError,
} from '../../functions/cleanup/reclaim-listing.ts';

function refusalOf(work: () => unknown): ReclaimRefusedError {
  try {
    work();
  } catch (error) {
    expect(error).toBeInstanceOf(ReclaimRefusedError);
    return error as ReclaimRefusedError;
  }
  throw new Error('expected a refusal');
}

describe('parseSandboxListing', () => {
  it('reads entries with and without generation, and a listing without count', () => {
    expect(
      parseSandboxListing(
        JSON.stringify({
          sandboxes: [
            { sandbox_id: 'a', sandbox_url: 'u', status: 'running', generation: 3 },
            { sandbox_id: 'b', sandbox_url: 'u', status: 'running' },
            { sandbox_id: 'c', generation: '7', extra: true },
          ],
        }),
      ),
    ).toEqual([
      { sandboxId: 'a', generation: 3, status: 'running', identity: '["u",null]' },
      { sandboxId: 'b', generation: null, status: 'running', identity: '["u",null]' },
      { sandboxId: 'c', generation: 7, status: null, identity: null },
    ]);
    expect(parseSandboxListing('{"sandboxes":[],"count":0}')).toEqual([]);
  });

  it('identifies a container by its URL and creation time: one created again under the id differs', () => {
    const identity = (createdAt: string) =>
      parseSandboxListing(
        JSON.stringify({ sandboxes: [{ sandbox_id: 'a', sandbox_url: 'u', created_at: createdAt }] }),
      )[0]!.identity;
    expect(identity('2026-11-30T17:00:00.000Z')).toBe(identity('2026-11-30T17:00:00.000Z'));
    expect(identity('2026-11-30T17:00:00.000Z')).not.toBe(identity('2026-11-30T17:00:01.000Z'));
  });

  it.each([
    ['not JSON', '<html>', ReclaimRefusal.LIST_NOT_JSON],
    ['null', 'null', ReclaimRefusal.LIST_BAD_SHAPE],
    ['a string', '"x"', ReclaimRefusal.LIST_BAD_SHAPE],
    ['sandboxes missing', '{}', ReclaimRefusal.LIST_BAD_SHAPE],
    ['an entry that is a string', '{"sandboxes":["a"]}', ReclaimRefusal.LIST_BAD_ENTRY],
    ['a numeric id', '{"sandboxes":[{"sandbox_id":5}]}', ReclaimRefusal.LIST_BAD_ENTRY],
    ['an empty id', '{"sandboxes":[{"sandbox_id":""}]}', ReclaimRefusal.LIST_BAD_ENTRY],
    ['an id with a newline', '{"sandboxes":[{"sandbox_id":"a\\nb"}]}', ReclaimRefusal.LIST_BAD_ENTRY],
    ['a lone surrogate', '{"sandboxes":[{"sandbox_id":"\\ud800"}]}', ReclaimRefusal.LIST_BAD_ENTRY],
    [
      'an unsafe generation',
      '{"sandboxes":[{"sandbox_id":"a","generation":1e300}]}',
      ReclaimRefusal.LIST_BAD_ENTRY,
    ],
    ['a status object', '{"sandboxes":[{"sandbox_id":"a","status":{}}]}', ReclaimRefusal.LIST_BAD_ENTRY],
    ['a duplicate', '{"sandboxes":[{"sandbox_id":"a"},{"sandbox_id":"a"}]}', ReclaimRefusal.LIST_DUPLICATE],
    ['count below', '{"sandboxes":[{"sandbox_id":"a"}],"count":0}', ReclaimRefusal.LIST_COUNT_MISMATCH],
    ['count as text', '{"sandboxes":[],"count":"0"}', ReclaimRefusal.LIST_COUNT_MISMATCH],
  ])('refuses %s', (_name, text, reason) => {
    expect(refusalOf(() => parseSandboxListing(text)).reason).toBe(reason);
  });
});

/** The brakes with no pairing evidence: what a listing alone decides. */
function refuseRunaway(listed: number, leaked: number, maxSharePercent: number, known: number) {
  return checkBrakes({ listed, leaked, known, maxSharePercent, pairedAt: null });
}

describe('the share rule', () => {
  it(`applies at every fleet size, with an allowance of ${SHARE_RULE_ALLOWANCE}`, () => {
    expect(refusalOf(() => refuseRunaway(9, 9, 50, 1)).reason).toBe(ReclaimRefusal.SHARE_EXCEEDED);
    expect(refusalOf(() => refuseRunaway(4, 3, 50, 1)).reason).toBe(ReclaimRefusal.SHARE_EXCEEDED);
    expect(() => refuseRunaway(2, SHARE_RULE_ALLOWANCE, 1, 1)).not.toThrow();
    expect(refusalOf(() => refuseRunaway(3, SHARE_RULE_ALLOWANCE + 1, 1, 1)).reason).toBe(
      ReclaimRefusal.SHARE_EXCEEDED,
    );
  });

  it('refuses above the share and accepts at it (rounded up)', () => {
    expect(refusalOf(() => refuseRunaway(20, 11, 50, 9)).reason).toBe(ReclaimRefusal.SHARE_EXCEEDED);
    expect(() => refuseRunaway(20, 10, 50, 10)).not.toThrow();
    expect(() => refuseRunaway(9, 5, 50, 4)).not.toThrow();
    expect(refusalOf(() => refuseRunaway(9, 6, 50, 3)).reason).toBe(ReclaimRefusal.SHARE_EXCEEDED);
  });

  it('refuses a listing no row knows, however small, unless the share is 100', () => {
    expect(refusalOf(() => refuseRunaway(1, 1, 50, 0)).reason).toBe(ReclaimRefusal.NO_KNOWN_SANDBOXES);
    expect(refusalOf(() => refuseRunaway(2, 1, 99, 0)).reason).toBe(ReclaimRefusal.NO_KNOWN_SANDBOXES);
    expect(() => refuseRunaway(1000, 1000, 100, 0)).not.toThrow();
    expect(() => refuseRunaway(0, 0, 50, 0)).not.toThrow();
  });

  it('calls a listing healthy only when it passes both brakes on its own', () => {
    expect(refuseRunaway(10, 2, 50, 8).healthy).toBe(true);
    expect(refuseRunaway(0, 0, 50, 0).healthy).toBe(false);
    expect(refuseRunaway(10, 10, 100, 0).healthy).toBe(false);
    expect(refuseRunaway(10, 9, 100, 3).healthy).toBe(false);
  });
});

describe('the brakes in a quiet fleet (issue 21, item 6)', () => {
  const now = Date.parse('2026-12-02T04:00:00Z');
  const hoursAgo = (hours: number) => new Date(now - hours * 3600_000);

  it('lift for a listing no row knows, or over the share, when a recent healthy listing vouches for the pairing', () => {
    // Every run ended at night: the only live sandboxes are three unrecorded leaks.
    expect(
      checkBrakes({ listed: 3, leaked: 3, known: 0, maxSharePercent: 50, pairedAt: hoursAgo(9), nowMs: now }),
    ).toEqual({
      brakeLifted: { brake: ReclaimRefusal.NO_KNOWN_SANDBOXES, pairedAt: hoursAgo(9).toISOString() },
      healthy: false,
    });
    // Leaks the database still names (a forced clear whose DELETE was never sent), all of the listing.
    expect(
      checkBrakes({ listed: 5, leaked: 5, known: 5, maxSharePercent: 50, pairedAt: hoursAgo(60), nowMs: now })
        .brakeLifted,
    ).toEqual({ brake: ReclaimRefusal.SHARE_EXCEEDED, pairedAt: hoursAgo(60).toISOString() });
  });

  it('still refuse a wrong pairing: no evidence for this provisioner, or evidence too old', () => {
    expect(
      refusalOf(() =>
        checkBrakes({ listed: 40, leaked: 40, known: 0, maxSharePercent: 50, pairedAt: null, nowMs: now }),
      ).reason,
    ).toBe(ReclaimRefusal.NO_KNOWN_SANDBOXES);
    const stale = hoursAgo(PAIRING_EVIDENCE_MAX_AGE_SECONDS / 3600 + 1);
    const refusal = refusalOf(() =>
      checkBrakes({ listed: 40, leaked: 30, known: 10, maxSharePercent: 50, pairedAt: stale, nowMs: now }),
    );
    expect(refusal.reason).toBe(ReclaimRefusal.SHARE_EXCEEDED);
    expect(refusal.message).toContain(stale.toISOString());
  });
});
