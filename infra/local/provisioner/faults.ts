import { z } from 'zod';
import { BadRequestError } from './errors.ts';
import type { ApiMethod } from './types.ts';

const methodSchema = z.enum(['GET', 'POST', 'DELETE']);
/** `'*'` matches every method; omitted means DELETE only, the call under test almost always. */
const methodFilterSchema = z.union([methodSchema, z.literal('*'), z.array(methodSchema).min(1)]);
const probabilitySchema = z.number().min(0).max(1);

/**
 * A `Retry-After` to send with a status fault: a raw header value (hostile ones included), or a
 * delay in seconds written as delta-seconds or as the HTTP-date that far from the moment of the
 * answer.
 */
const retryAfterSchema = z.union([
  z.string().max(1000),
  z.strictObject({ seconds: z.number().int(), as: z.enum(['delta-seconds', 'http-date']) }),
]);
export type RetryAfterFault = z.infer<typeof retryAfterSchema>;

/** Which requests a fault applies to, shared by every fault kind. */
const scope = {
  method: methodFilterSchema.optional(),
  /** Applies to the next `times` matching requests, then expires. Unlimited when omitted. */
  times: z.number().int().positive().optional(),
  /** Applies to each matching request with this probability, drawn from the seeded PRNG. */
  probability: probabilitySchema.optional(),
};

/**
 * A fault, as set with `setFault` or `POST /_control/faults`. Exactly one kind per fault:
 * - `latencyMs`: wait, then handle normally. With `completeIfAbandoned`, a request whose client
 *   gave up during the wait is still carried out (nobody hears the answer), as a real provisioner
 *   finishes a DELETE it accepted: the late DELETE an operator's forced clear must not race.
 * - `hang`: never answer, until the client disconnects, the provisioner stops, or the fault
 *   is cleared; a request released by clearing is then handled normally.
 * - `status` (+ `body`, `contentType`, `retryAfter`): answer that status without touching the
 *   sandbox: a 429 or 503 with a Retry-After, a catch-all server's 200 with an HTML page
 *   (`contentType: 'text/html'`) or an empty body (`body: ''`). With `deleteAfterMs` (a DELETE
 *   only), the sandbox is deleted for real that long after the answer: a provisioner that answers
 *   `202` or `200 {"status":"deleting"}` and carries the delete out later, as an asynchronous one
 *   does (the audit entry's `deletedAt` then comes after its `endedAt`).
 * - `gone`: handle for real (the sandbox is deleted), then answer 410 where the real answer was
 *   200 or 404: a provisioner that reports a removed sandbox as gone.
 * - `reset`: destroy the connection without answering. With `afterHandling`, the request is
 *   handled for real first (the sandbox is deleted) and only the answer is lost.
 * - `conflictGeneration`: answer `409 {"current_generation": n}` without touching anything.
 * - `oversizedBodyBytes`: handle for real, answer the real status with a body of n bytes.
 * - `slowBodyMs`: handle for real, write the headers, then drip the body over n ms.
 */
export const faultSchema = z.union([
  z.strictObject({
    latencyMs: z.number().int().nonnegative(),
    completeIfAbandoned: z.boolean().optional(),
    ...scope,
  }),
  z.strictObject({ hang: z.literal(true), ...scope }),
  z.strictObject({
    status: z.number().int().min(100).max(599),
    body: z.string().optional(),
    contentType: z.string().min(1).max(200).optional(),
    retryAfter: retryAfterSchema.optional(),
    deleteAfterMs: z.number().int().nonnegative().optional(),
    ...scope,
  }),
  z.strictObject({ gone: z.literal(true), ...scope }),
  z.strictObject({ reset: z.literal(true), afterHandling: z.boolean().optional(), ...scope }),
  z.strictObject({ conflictGeneration: z.number().int().nonnegative(), ...scope }),
  z.strictObject({ oversizedBodyBytes: z.number().int().positive(), ...scope }),
  z.strictObject({ slowBodyMs: z.number().int().nonnegative(), ...scope }),
]);
export type Fault = z.infer<typeof faultSchema>;

/**
 * A global random mix for the demo: each matching request that no explicit fault claimed
 * draws one number; `hang`, `error`, `reset` and `slow` are the probabilities of each
 * misbehaviour (their sum at most 1). `error` answers `errorStatus` (503); `slow` waits
 * `slowMs` (1000) before handling normally. Given `slowMs` but no `slow`, every request
 * the draw did not give another fault is slowed: `{ hang: 0.05, error: 0.1, slowMs: 200 }`
 * reads as "5 % hang, 10 % fail, the rest take 200 ms".
 */
export const faultProfileSchema = z
  .strictObject({
    hang: probabilitySchema.optional(),
    error: probabilitySchema.optional(),
    reset: probabilitySchema.optional(),
    slow: probabilitySchema.optional(),
    slowMs: z.number().int().nonnegative().optional(),
    errorStatus: z.number().int().min(400).max(599).optional(),
    method: methodFilterSchema.optional(),
  })
  .refine((p) => (p.hang ?? 0) + (p.error ?? 0) + (p.reset ?? 0) + (p.slow ?? 0) <= 1, {
    message: 'hang + error + reset + slow must be at most 1',
  });
export type FaultProfile = z.infer<typeof faultProfileSchema>;

/** What the request pipeline must do; one case per fault kind. */
export type FaultAction =
  | { readonly kind: 'latency'; readonly ms: number; readonly completeIfAbandoned?: boolean }
  | { readonly kind: 'hang' }
  | {
      readonly kind: 'status';
      readonly status: number;
      readonly body: string | undefined;
      readonly contentType?: string | undefined;
      readonly retryAfter?: RetryAfterFault | undefined;
      /** Carry a DELETE out for real this long after the answer. */
      readonly deleteAfterMs?: number | undefined;
    }
  | { readonly kind: 'gone' }
  | { readonly kind: 'reset'; readonly afterHandling: boolean }
  | { readonly kind: 'conflict'; readonly currentGeneration: number }
  | { readonly kind: 'oversized'; readonly bytes: number }
  | { readonly kind: 'slow-body'; readonly ms: number };

/** A fault chosen for one request. `source` is what clearing must name to release a hang. */
export interface FaultDecision {
  readonly action: FaultAction;
  /** For the audit log: `latency`, `hang`, `status:503`, `reset`, `conflict:4`, … */
  readonly label: string;
  readonly source: string;
}

/** The source of faults chosen by the profile rather than by a rule. */
const PROFILE_SOURCE = '#profile';

/** A deterministic PRNG (mulberry32), so a seed reproduces a chaos or benchmark run. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface FaultRule {
  readonly fault: Fault;
  remaining: number | undefined;
}

interface HangWaiter {
  readonly source: string;
  readonly release: () => void;
}

/**
 * The faults in force. Rules are kept per target (a sandbox id or `'*'`) in the order they
 * were set; a request takes the first applicable rule of its sandbox id, then of `'*'`, then
 * the profile. A rule whose probability roll fails is skipped without using up its `times`.
 */
export class FaultTable {
  readonly #rules = new Map<string, FaultRule[]>();
  readonly #hangWaiters = new Set<HangWaiter>();
  readonly #random: () => number;
  #profile: FaultProfile | undefined;

  constructor(seed: number) {
    this.#random = seededRandom(seed);
  }

  /** Adds a fault for `target` (a sandbox id or `'*'`); throws `BadRequestError` if invalid. */
  set(target: string, fault: Fault): void {
    const parsed = faultSchema.safeParse(fault);
    if (!parsed.success) throw new BadRequestError(`invalid fault: ${z.prettifyError(parsed.error)}`);
    const rules = this.#rules.get(target) ?? [];
    rules.push({ fault: parsed.data, remaining: parsed.data.times });
    this.#rules.set(target, rules);
  }

  /** Sets (or with `undefined` removes) the profile; removing it releases its hung requests. */
  setProfile(profile: FaultProfile | undefined): void {
    if (profile === undefined) {
      this.#profile = undefined;
      this.#release((source) => source === PROFILE_SOURCE);
      return;
    }
    const parsed = faultProfileSchema.safeParse(profile);
    if (!parsed.success) throw new BadRequestError(`invalid fault profile: ${z.prettifyError(parsed.error)}`);
    this.#profile = parsed.data;
  }

  /**
   * Removes the faults of `target`, or every fault and the profile when `target` is omitted.
   * Requests hung by a removed fault are released and then handled normally.
   */
  clear(target?: string): void {
    if (target === undefined) {
      this.#rules.clear();
      this.#profile = undefined;
      this.#release(() => true);
      return;
    }
    this.#rules.delete(target);
    this.#release((source) => source === target);
  }

  /** Chooses the fault for one API request, using up one of its `times`; undefined for none. */
  pick(method: ApiMethod, sandboxId: string | undefined): FaultDecision | undefined {
    const targets = sandboxId === undefined ? ['*'] : [sandboxId, '*'];
    for (const target of targets) {
      const rules = this.#rules.get(target);
      if (!rules) continue;
      for (const rule of rules) {
        if (!methodMatches(rule.fault.method, method)) continue;
        if (rule.fault.probability !== undefined && this.#random() >= rule.fault.probability) continue;
        if (rule.remaining !== undefined) {
          rule.remaining -= 1;
          if (rule.remaining === 0) rules.splice(rules.indexOf(rule), 1);
        }
        const action = toAction(rule.fault);
        return { action, label: labelOf(action), source: target };
      }
    }
    return this.#pickFromProfile(method);
  }

  /**
   * Holds a hung request until its fault is cleared (`'released'`) or `signal` aborts
   * (`'aborted'`: the client left or the provisioner is stopping).
   */
  waitForRelease(source: string, signal: AbortSignal): Promise<'released' | 'aborted'> {
    if (signal.aborted) return Promise.resolve('aborted');
    return new Promise((resolve) => {
      const waiter: HangWaiter = {
        source,
        release: () => {
          signal.removeEventListener('abort', onAbort);
          resolve('released');
        },
      };
      const onAbort = () => {
        this.#hangWaiters.delete(waiter);
        resolve('aborted');
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.#hangWaiters.add(waiter);
    });
  }

  #pickFromProfile(method: ApiMethod): FaultDecision | undefined {
    const profile = this.#profile;
    if (!profile || !methodMatches(profile.method, method)) return undefined;
    const draw = this.#random();
    const choices: Array<[number | undefined, FaultAction]> = [
      [profile.hang, { kind: 'hang' }],
      [profile.error, { kind: 'status', status: profile.errorStatus ?? 503, body: undefined }],
      [profile.reset, { kind: 'reset', afterHandling: false }],
      [slowProbability(profile), { kind: 'latency', ms: profile.slowMs ?? 1000 }],
    ];
    let threshold = 0;
    for (const [probability, action] of choices) {
      threshold += probability ?? 0;
      if (draw < threshold) return { action, label: `profile:${labelOf(action)}`, source: PROFILE_SOURCE };
    }
    return undefined;
  }

  #release(matches: (source: string) => boolean): void {
    for (const waiter of this.#hangWaiters) {
      if (!matches(waiter.source)) continue;
      this.#hangWaiters.delete(waiter);
      waiter.release();
    }
  }
}

function slowProbability(profile: FaultProfile): number {
  if (profile.slow !== undefined || profile.slowMs === undefined) return profile.slow ?? 0;
  return 1 - (profile.hang ?? 0) - (profile.error ?? 0) - (profile.reset ?? 0);
}

function methodMatches(filter: Fault['method'], method: ApiMethod): boolean {
  if (filter === undefined) return method === 'DELETE';
  if (filter === '*') return true;
  return Array.isArray(filter) ? filter.includes(method) : filter === method;
}

function toAction(fault: Fault): FaultAction {
  if ('latencyMs' in fault) {
    return fault.completeIfAbandoned
      ? { kind: 'latency', ms: fault.latencyMs, completeIfAbandoned: true }
      : { kind: 'latency', ms: fault.latencyMs };
  }
  if ('hang' in fault) return { kind: 'hang' };
  if ('status' in fault) {
    return {
      kind: 'status',
      status: fault.status,
      body: fault.body,
      contentType: fault.contentType,
      retryAfter: fault.retryAfter,
      deleteAfterMs: fault.deleteAfterMs,
    };
  }
  if ('gone' in fault) return { kind: 'gone' };
  if ('reset' in fault) return { kind: 'reset', afterHandling: fault.afterHandling ?? false };
  if ('conflictGeneration' in fault) return { kind: 'conflict', currentGeneration: fault.conflictGeneration };
  if ('oversizedBodyBytes' in fault) return { kind: 'oversized', bytes: fault.oversizedBodyBytes };
  return { kind: 'slow-body', ms: fault.slowBodyMs };
}

function labelOf(action: FaultAction): string {
  switch (action.kind) {
    case 'status':
      return `status:${action.status}${action.retryAfter === undefined ? '' : '+retry-after'}${action.deleteAfterMs === undefined ? '' : '+deleted-later'}`;
    case 'conflict':
      return `conflict:${action.currentGeneration}`;
    case 'reset':
      return action.afterHandling ? 'reset-after-handling' : 'reset';
    case 'latency':
      return action.completeIfAbandoned ? 'latency-complete-if-abandoned' : 'latency';
    default:
      return action.kind;
  }
}
