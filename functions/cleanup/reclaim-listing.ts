/**
 * The provisioner's listing (`GET /api/sandboxes`, contract v1.1 section 3) as the reclaimer may
 * act on it: `{"sandboxes": [{sandbox_id, sandbox_url, status, generation?}], "count": N}`.
 *
 * A listing is evidence for deletes, so anything odd about it refuses the whole reclaim run with a
 * reason and deletes nothing: a reply that is not JSON, too large, of the wrong shape, with an
 * entry that is not a sandbox, with one id twice, or whose `count` disagrees with its entries
 * (a paginated or truncated reply this project does not know how to read). Nothing here is
 * "skipped and carried on": a half-understood listing could make live sandboxes look leaked.
 */
export const ReclaimRefusal = {
  /** Connection failure, timeout, 408/429/5xx: try next run. */
  LIST_UNAVAILABLE: 'list_unavailable',
  /** Another 4xx, or a status the contract does not give the list. */
  LIST_REJECTED: 'list_rejected',
  LIST_TOO_LARGE: 'list_too_large',
  LIST_NOT_JSON: 'list_not_json',
  LIST_BAD_SHAPE: 'list_bad_shape',
  LIST_BAD_ENTRY: 'list_bad_entry',
  LIST_DUPLICATE: 'list_duplicate',
  LIST_COUNT_MISMATCH: 'list_count_mismatch',
  /** More of the listing looks leaked than RECLAIM_MAX_SHARE_PERCENT allows: trust neither side. */
  SHARE_EXCEEDED: 'share_exceeded',
  /** No listed sandbox is named by any row (RECLAIM_MAX_SHARE_PERCENT below 100): a foreign database. */
  NO_KNOWN_SANDBOXES: 'no_known_sandboxes',
} as const;
export type ReclaimRefusal = (typeof ReclaimRefusal)[keyof typeof ReclaimRefusal];

/** A whole reclaim run refused before any DELETE; `reason` is the metric dimension. */
export class ReclaimRefusedError extends Error {
  readonly code = 'RECLAIM_REFUSED';
  constructor(
    readonly reason: ReclaimRefusal,
    message: string,
    readonly details: Readonly<Record<string, unknown>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'ReclaimRefusedError';
  }
}

export interface ListedSandbox {
  sandboxId: string;
  /** Null when the reply carries none (the platform's provisioner today). */
  generation: number | null;
  status: string | null;
  /**
   * What the entry says that changes when a container is created again under the same id (its
   * `sandbox_url` and, when given, `created_at`), or null when it gives neither. A change restarts
   * the streak, like a changed generation: the only such signal a listing without generation has.
   */
  identity?: string | null;
}

/**
 * A listing of 100 000 sandboxes at ~200 bytes each; a reply larger than this is not a listing
 * this project can hold in a Lambda's memory and act on safely.
 */
export const MAX_LIST_BODY_BYTES = 32 * 1024 * 1024;

export function parseSandboxListing(text: string): ListedSandbox[] {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw new ReclaimRefusedError(ReclaimRefusal.LIST_NOT_JSON, 'the provisioner listing is not JSON', {
      start: text.slice(0, 80),
    });
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new ReclaimRefusedError(
      ReclaimRefusal.LIST_BAD_SHAPE,
      'the provisioner listing is not a JSON object',
    );
  }
  const { sandboxes, count } = body as { sandboxes?: unknown; count?: unknown };
  if (!Array.isArray(sandboxes)) {
    throw new ReclaimRefusedError(
      ReclaimRefusal.LIST_BAD_SHAPE,
      'the provisioner listing has no "sandboxes" array',
    );
  }
  if (count !== undefined && count !== sandboxes.length) {
    throw new ReclaimRefusedError(
      ReclaimRefusal.LIST_COUNT_MISMATCH,
      `the provisioner listing says count ${JSON.stringify(count)} but holds ${sandboxes.length} sandboxes (paginated or truncated?)`,
      { count: typeof count === 'number' ? count : String(count), entries: sandboxes.length },
    );
  }
  const seen = new Set<string>();
  return sandboxes.map((entry, index) => {
    const listed = parseEntry(entry, index);
    if (seen.has(listed.sandboxId)) {
      throw new ReclaimRefusedError(
        ReclaimRefusal.LIST_DUPLICATE,
        `the provisioner listing names sandbox ${JSON.stringify(listed.sandboxId)} twice`,
        { sandboxId: listed.sandboxId },
      );
    }
    seen.add(listed.sandboxId);
    return listed;
  });
}

function parseEntry(entry: unknown, index: number): ListedSandbox {
  const bad = (why: string) =>
    new ReclaimRefusedError(ReclaimRefusal.LIST_BAD_ENTRY, `provisioner listing entry ${index}: ${why}`, {
      index,
    });
  if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) throw bad('not an object');
  const {
    sandbox_id: sandboxId,
    generation,
    status,
    sandbox_url: sandboxUrl,
    created_at: createdAt,
  } = entry as Record<string, unknown>;
  if (typeof sandboxId !== 'string') throw bad('sandbox_id is not a string');
  if (!isDeletableSandboxId(sandboxId)) {
    throw bad(`sandbox_id ${JSON.stringify(sandboxId.slice(0, 80))} is not a valid sandbox id`);
  }
  let parsedGeneration: number | null = null;
  if (generation !== undefined && generation !== null) {
    const value =
      typeof generation === 'string' && /^\d+$/.test(generation) ? Number(generation) : generation;
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
      throw bad(`generation ${JSON.stringify(generation)} is not a non-negative integer`);
    }
    parsedGeneration = value;
  }
  if (status !== undefined && status !== null && typeof status !== 'string')
    throw bad('status is not a string');
  const url = typeof sandboxUrl === 'string' ? sandboxUrl : null;
  const created = typeof createdAt === 'string' || typeof createdAt === 'number' ? String(createdAt) : null;
  return {
    sandboxId,
    generation: parsedGeneration,
    status: typeof status === 'string' ? status : null,
    identity: url === null && created === null ? null : JSON.stringify([url, created]),
  };
}

/**
 * The ids the provisioner client can send a DELETE for (its `assertSafeSandboxId`): one the client
 * would refuse later makes the listing itself suspect, so it is refused here, before anything.
 */
function isDeletableSandboxId(id: string): boolean {
  if (id.length === 0 || id.length > 512 || id === '.' || id === '..') return false;
  if (/\p{Cs}/u.test(id)) return false;
  for (let i = 0; i < id.length; i += 1) {
    const code = id.charCodeAt(i);
    if (code < 0x20 || code === 0x7f) return false;
  }
  return true;
}
