import { Agent, type Dispatcher } from 'undici';
import {
  CleanupError,
  CleanupTimeoutError,
  GenerationAnomalyError,
  InvalidMessageError,
  ProvisionerAuthenticationError,
  ProvisionerBadResponseError,
  ProvisionerConnectionError,
  ProvisionerDeleteTimeoutError,
  ProvisionerRejectedError,
  ProvisionerThrottledError,
  ProvisionerUnavailableError,
  ProvisionerUnconfirmedError,
  ProvisionerUrlUnverifiedError,
} from '../cleanup/errors.ts';
import {
  type ListedSandbox,
  MAX_LIST_BODY_BYTES,
  parseSandboxListing,
  ReclaimRefusal,
  ReclaimRefusedError,
} from '../cleanup/reclaim-listing.ts';
import type { DeleteSandboxRequest, SandboxDeleteClient } from '../cleanup/sandbox-provider.ts';
import { ReleaseOutcome } from '../cleanup/types.ts';
import { type Deadline, startDeadline } from './deadline.ts';
import { judgeDeleteAnswer } from './delete-answer.ts';
import { MESSAGE_FIELD_LIMITS } from './messages.ts';
import { REDACTED, redactSecrets } from './redact.ts';
import { parseRetryAfter } from './retry-after.ts';

/**
 * The provisioner's `DELETE /api/sandboxes/{id}?generation=G` over undici, with the contract's
 * reply semantics (v1.1, section 3):
 *
 *   200 with a JSON object, or 204: deleted · 404, 410 with no body or a JSON one, from a base URL
 *   verified to be the provisioner (v1.2): absent (gone) · 401: the token refused (v1.2) · 409
 *   {current_generation: N}: N > G superseded (success), N < G anomaly · 408, 429, 5xx,
 *   connection errors, timeouts retryable, a 429's or 503's Retry-After carried to the consumer ·
 *   a 200 without a JSON object, or whose object reports a failure or names another sandbox or
 *   generation, and a 404/410 page (HTML, text) from whatever else answers at a wrong URL:
 *   unconfirmed (non-retryable) · other 4xx non-retryable.
 *
 * 410 is reported as ABSENT rather than as an outcome of its own: the outcome travels in the
 * `runtime-finalize` body, and a finalize of the previous release still consuming during a deploy
 * would dead-letter a value it does not know and leave the fence up.
 *
 * Every body is consumed or destroyed (an unread body pins its connection), and never read past
 * MAX_RESPONSE_BODY_BYTES: a hostile provisioner cannot make us buffer without bound.
 */
export const MAX_RESPONSE_BODY_BYTES = 64 * 1024;

/** A stale kept-alive socket (e.g. after a Lambda freeze) fails with a reset on reuse. */
const RESET_ERROR_CODES = new Set(['ECONNRESET', 'UND_ERR_SOCKET', 'EPIPE']);

/**
 * Connection failures that happen before a request can leave this process: nothing listening
 * (refused), no address for the name, no route. Only these leave no DELETE behind that the
 * provisioner may still carry out; a reset or a closed socket can come after the request was
 * written.
 */
const NEVER_CONNECTED_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
]);

/** Rejects ids that a URL parser could turn into a different path (dot segments, controls). */
export function assertSafeSandboxId(sandboxId: string): void {
  if (
    sandboxId.length === 0 ||
    sandboxId.length > MESSAGE_FIELD_LIMITS.id ||
    sandboxId === '.' ||
    sandboxId === '..' ||
    hasControlCharacter(sandboxId) ||
    // A lone surrogate cannot be percent-encoded (encodeURIComponent throws a URIError, which
    // would be retried as an unknown failure instead of refused at once).
    /\p{Cs}/u.test(sandboxId)
  ) {
    throw new InvalidMessageError(
      `sandbox id ${JSON.stringify(sandboxId.slice(0, 80))} is not a valid sandbox id`,
      {
        field: 'sandboxId',
      },
    );
  }
}

function hasControlCharacter(text: string): boolean {
  for (let i = 0; i < text.length; i += 1) {
    const code = text.charCodeAt(i);
    if (code < 0x20 || code === 0x7f) return true;
  }
  return false;
}

/**
 * A listing taken to check a 404/410 (`#confirmAbsence`): the order it started in among this
 * client's answers (`#ticks`), and what it found. It can vouch only for the 404s answered before
 * it started.
 */
interface AbsenceListing {
  readonly startedAt: number;
  readonly result: Promise<ListedSandbox[] | ReclaimRefusedError>;
}

/** The provisioner's bearer token (contract v1.2 section 3), already read, and how to read it again. */
export interface ProvisionerToken {
  /** Where it comes from, for messages (`SANDBOX_PROVISIONER_TOKEN`, `SSM parameter …`); never the value. */
  readonly origin: string;
  readonly value: string;
  /** Reads it again after a 401 (a rotation): the request is resent once if it changed. */
  reread(): Promise<string>;
}

export interface ProvisionerClientOptions {
  dispatcher?: Dispatcher;
  /** Sent on every request as `Authorization: Bearer <token>`; never logged, never in an error. */
  token?: ProvisionerToken;
  /** Told of every 404/410 refused because the base URL is not the provisioner (a metric). */
  onUrlUnverified?: (error: ProvisionerUrlUnverifiedError) => void;
}

export class ProvisionerClient implements SandboxDeleteClient {
  readonly #origin: string;
  readonly #basePath: string;
  /** The base URL as messages show it: no userinfo, no query. */
  readonly #shownBaseUrl: string;
  readonly #dispatcher: Dispatcher;
  readonly #token: ProvisionerToken | undefined;
  #tokenValue: string | undefined;
  /** Every token this client has sent, for keeping them out of what it reports (`#scrub`). */
  readonly #tokensSent = new Set<string>();
  readonly #onUrlUnverified: ((error: ProvisionerUrlUnverifiedError) => void) | undefined;
  /** Orders 404/410 answers and the listings that check them (`#confirmAbsence`). */
  #ticks = 0;
  /** The newest listing taken to check a 404/410, while it is in flight. */
  #absenceListing: AbsenceListing | undefined;

  constructor(baseUrl: string, options: ProvisionerClientOptions = {}) {
    const url = new URL(baseUrl);
    this.#origin = url.origin;
    this.#basePath = url.pathname.replace(/\/+$/, '');
    this.#shownBaseUrl = redactSecrets(`${url.origin}${this.#basePath}`);
    // Short keep-alive: a socket idle for longer is more likely dead than reusable.
    this.#dispatcher = options.dispatcher ?? new Agent({ keepAliveTimeout: 4_000, connections: 64 });
    this.#token = options.token;
    this.#tokenValue = options.token?.value;
    if (this.#tokenValue !== undefined) this.#tokensSent.add(this.#tokenValue);
    this.#onUrlUnverified = options.onUrlUnverified;
  }

  async deleteSandbox(request: DeleteSandboxRequest): Promise<ReleaseOutcome> {
    assertSafeSandboxId(request.sandboxId);
    try {
      return await this.#deleteAttempts(request);
    } catch (error) {
      throw this.#scrub(error);
    }
  }

  async #deleteAttempts(request: DeleteSandboxRequest): Promise<ReleaseOutcome> {
    try {
      return await this.#deleteOnce(request);
    } catch (error) {
      // One immediate retry for a reset before any answer (a stale kept-alive socket): the delete
      // is idempotent by generation. But a reset can come AFTER the request was written, and the
      // provisioner may then be carrying that first DELETE out while the retry is answered (a 404
      // once it is gone). The caller is told, so the scope's delete-in-flight record keeps a
      // window as if that request were still running; the retry's own failure says so too.
      if (error instanceof ProvisionerConnectionError && error.details.reset && !request.signal?.aborted) {
        request.onUnansweredAttempt?.(error);
        try {
          return await this.#deleteOnce(request, { afterUnansweredAttempt: true });
        } catch (retryError) {
          // Whatever the retry heard, the first request may still be acting at the provisioner.
          throw retryError instanceof CleanupError ? CleanupError.markMayStillAct(retryError) : retryError;
        }
      }
      throw error;
    }
  }

  /**
   * Ends the client, aborting any DELETE still waiting for its answer rather than waiting for it
   * (a graceful close waited up to SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS for a hung one, and
   * held a stopping stack that long). Aborting is safe: the fence stays up, and the guard's
   * delete-in-flight record keeps the scope closed for as long as the DELETE could still land.
   */
  async close(): Promise<void> {
    await this.#dispatcher.destroy();
  }

  /**
   * `GET /api/sandboxes` (contract v1.1 section 3), for the reclaimer only. Bounded in time
   * (`timeoutMs`, headers and body) and in size (MAX_LIST_BODY_BYTES); any reply that is not a
   * complete, well-formed listing throws ReclaimRefusedError with its reason, so the run deletes
   * nothing (reclaim-listing.ts).
   */
  async listSandboxes(options: { timeoutMs: number; signal?: AbortSignal }): Promise<ListedSandbox[]> {
    const deadline = startDeadline(options.timeoutMs, options.signal);
    try {
      return await this.#list(deadline.signal, options.timeoutMs);
    } catch (error) {
      throw this.#scrub(error);
    } finally {
      deadline.dispose();
    }
  }

  async #list(signal: AbortSignal, timeoutMs: number): Promise<ListedSandbox[]> {
    let response: Dispatcher.ResponseData;
    try {
      response = await this.#send({
        origin: this.#origin,
        path: `${this.#basePath}/api/sandboxes`,
        method: 'GET',
        headers: { accept: 'application/json' },
        signal,
        headersTimeout: timeoutMs,
        bodyTimeout: timeoutMs,
      });
    } catch (error) {
      throw listUnavailable(error);
    }
    const { statusCode } = response;
    if (statusCode !== 200) {
      const contentType = mediaTypeOf(response);
      const problem = await problemSummary(response).catch(() => undefined);
      const retryable = statusCode === 408 || statusCode === 429 || (statusCode >= 500 && statusCode <= 599);
      throw new ReclaimRefusedError(
        retryable ? ReclaimRefusal.LIST_UNAVAILABLE : ReclaimRefusal.LIST_REJECTED,
        `the provisioner answered the listing with ${statusCode}${problem === undefined ? '' : `: ${problem}`}`,
        {
          status: statusCode,
          ...(contentType ? { contentType } : {}),
          ...(problem !== undefined ? { problem } : {}),
        },
      );
    }
    let text: string | undefined;
    try {
      text = await readLimited(response.body, MAX_LIST_BODY_BYTES);
    } catch (error) {
      response.body.destroy();
      throw listUnavailable(error);
    }
    if (text === undefined) {
      throw new ReclaimRefusedError(
        ReclaimRefusal.LIST_TOO_LARGE,
        `the provisioner listing is larger than ${MAX_LIST_BODY_BYTES} bytes`,
        { limitBytes: MAX_LIST_BODY_BYTES },
      );
    }
    return parseSandboxListing(text);
  }

  /**
   * One request, with `Authorization: Bearer <token>` when a token is configured. A 401 reads the
   * token again, once (overlapping 401s share the read, and a 401 to a token already replaced
   * takes the replacement without one): if it changed, the request is sent once
   * more with the new token; a refused request did nothing at the provisioner, so resending it is
   * safe. A 401 that stays (the same token, or a 401 again) is ProvisionerAuthenticationError.
   */
  async #send(options: Dispatcher.RequestOptions & { headers?: Record<string, string> }) {
    const attempt = (token: string | undefined) =>
      this.#dispatcher.request({
        ...options,
        headers: { ...options.headers, ...(token === undefined ? {} : { authorization: `Bearer ${token}` }) },
      });
    const used = this.#tokenValue;
    let response = await attempt(used);
    if (response.statusCode !== 401) return response;
    await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES }).catch(() => {});
    if (this.#token === undefined) {
      throw this.#unauthorized(
        'and no token is configured: set SANDBOX_PROVISIONER_TOKEN_PARAMETER (deployed) or SANDBOX_PROVISIONER_TOKEN',
      );
    }
    // Another request may have read the new token meanwhile: that one is tried, without a read.
    let next = this.#tokenValue;
    if (next === used) {
      next = await this.#token.reread();
      if (next === used) {
        throw this.#unauthorized(`to the token from ${this.#token.origin}, also after reading it again`);
      }
      this.#tokenValue = next;
      this.#tokensSent.add(next);
    }
    response = await attempt(next);
    if (response.statusCode !== 401) return response;
    await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES }).catch(() => {});
    throw this.#unauthorized(
      `to the token from ${this.#token.origin}, also to the one read again after a 401`,
    );
  }

  #unauthorized(why: string): ProvisionerAuthenticationError {
    return new ProvisionerAuthenticationError(
      `provisioner answered 401 (unauthorized) ${why}; check the provisioner's token and ${this.#token?.origin ?? 'SANDBOX_PROVISIONER_TOKEN'}`,
      { status: 401, ...(this.#token ? { tokenOrigin: this.#token.origin } : {}) },
      ANSWERED,
    );
  }

  /**
   * Contract v1.2 section 3: a 404 or 410 counts as gone only from a base URL known to be the
   * provisioner, one whose `GET /api/sandboxes` answers a listing (reclaim-listing.ts, the
   * reclaimer's own parser). And the listing must agree: it must not name the sandbox. A gateway
   * that routes the listing but not the DELETE (an API Gateway route left out, an exact-path
   * Envoy route) answers every DELETE with its own JSON or empty 404 while the listing names the
   * sandbox alive; an ingress re-routed mid-deploy answers 404s for a while from something else.
   * So each 404/410 is checked by a listing that STARTED AFTER it was answered: concurrent 404s
   * share one (a cold start's burst costs one listing), but no earlier listing, the reclaimer's
   * included, vouches for a later 404. A 200 or 204 needs none (the platform's provisioner answers
   * every DELETE with 200): a 404 is the rare answer (a retry after a delete that landed, a
   * sandbox reaped while idle), so a correct URL costs no request beyond the DELETE in steady
   * state, and one listing per burst of 404s otherwise.
   *
   * Not the provisioner (a 4xx, a page, JSON of another shape): ProvisionerUrlUnverifiedError, a
   * dead letter naming the URL and what it answered. The listing names the sandbox:
   * ProvisionerUnconfirmedError, a dead letter too (resending the DELETE would hear the same 404).
   * The listing failing as a request can (timeout, reset, 408/429/5xx): retryable, fence kept,
   * and the next attempt checks again.
   */
  async #confirmAbsence(
    answeredAt: number,
    context: { sandboxId: string; generation: number; status: number },
    exchange: Exchange,
  ): Promise<void> {
    const listingRequest = `GET ${this.#shownBaseUrl}/api/sandboxes`;
    let listing = this.#absenceListing;
    if (listing === undefined || listing.startedAt < answeredAt) {
      const started: AbsenceListing = {
        startedAt: ++this.#ticks,
        result: this.#listForAbsence(exchange.timeoutMs).finally(() => {
          if (this.#absenceListing === started) this.#absenceListing = undefined;
        }),
      };
      this.#absenceListing = started;
      listing = started;
    }
    const result = await untilAborted(listing.result, exchange.signal);
    if (!(result instanceof ReclaimRefusedError)) {
      const named = result.find((entry) => entry.sandboxId === context.sandboxId);
      if (named === undefined) return;
      throw new ProvisionerUnconfirmedError(
        `provisioner answered ${context.status}, but ${listingRequest}, taken after it, still lists sandbox ${context.sandboxId}${named.status === null ? '' : ` (status ${JSON.stringify(named.status.slice(0, 40))})`}: the ${context.status} is no confirmation (a gateway that routes the listing but not the DELETE?): check SANDBOX_PROVISIONER_URL and the route of DELETE ${this.#shownBaseUrl}/api/sandboxes/{id}`,
        { ...context, baseUrl: this.#shownBaseUrl, stillListed: true },
        ANSWERED,
      );
    }
    if (result.reason === ReclaimRefusal.LIST_UNAVAILABLE) {
      // The listing's own failure decides: a refused token is the token's.
      if (result.cause instanceof CleanupError) throw result.cause;
      throw new ProvisionerUnavailableError(
        `provisioner answered ${context.status}, but ${listingRequest} (checking that ${this.#shownBaseUrl} is the provisioner and the sandbox is gone) failed: ${result.message}`,
        { ...context, ...verificationFacts(result) },
        // The DELETE itself was answered (404/410); only the listing that would confirm it failed.
        { cause: result, ...ANSWERED },
      );
    }
    const unverified = new ProvisionerUrlUnverifiedError(
      `provisioner answered ${context.status}, but ${this.#shownBaseUrl} is not known to be the provisioner: ${listingRequest} answered ${describeListingRefusal(result)}, not the provisioner's listing, so the ${context.status} is no confirmation (a web framework's "no such route" at a wrong path prefix?): check SANDBOX_PROVISIONER_URL`,
      { ...context, baseUrl: this.#shownBaseUrl, ...verificationFacts(result) },
      { cause: result, ...ANSWERED },
    );
    this.#onUrlUnverified?.(unverified);
    throw unverified;
  }

  /** The listing, for `#confirmAbsence`: its entries, or its refusal (never thrown). */
  async #listForAbsence(timeoutMs: number): Promise<ListedSandbox[] | ReclaimRefusedError> {
    const deadline = startDeadline(timeoutMs);
    try {
      return await this.#list(deadline.signal, timeoutMs);
    } catch (error) {
      if (error instanceof ReclaimRefusedError) return error;
      throw error;
    } finally {
      deadline.dispose();
    }
  }

  /**
   * The tokens this client sent, taken out of an error it reports: a provisioner (or a proxy) may
   * echo a request's Authorization header into its answer, and an answer's words go into reasons.
   */
  #scrub(error: unknown): unknown {
    if (this.#tokensSent.size === 0 || !(error instanceof Error)) return error;
    const clean = (text: string) => {
      let result = text;
      for (const token of this.#tokensSent) result = result.replaceAll(token, REDACTED);
      return result;
    };
    error.message = clean(error.message);
    const details = (error as { details?: Record<string, unknown> }).details;
    if (details !== undefined && typeof details === 'object') {
      for (const [key, value] of Object.entries(details)) {
        if (typeof value === 'string') details[key] = clean(value);
      }
    }
    return error;
  }

  async #deleteOnce(
    request: DeleteSandboxRequest,
    facts: Record<string, unknown> = {},
  ): Promise<ReleaseOutcome> {
    const { sandboxId, generation, deleteTimeoutMs } = request;
    const deadline = startDeadline(deleteTimeoutMs, request.signal);
    const path = `${this.#basePath}/api/sandboxes/${encodeURIComponent(sandboxId)}?generation=${generation}`;
    const context = { sandboxId, generation, ...facts };
    try {
      let response: Dispatcher.ResponseData;
      try {
        response = await this.#send({
          origin: this.#origin,
          path,
          method: 'DELETE',
          signal: deadline.signal,
          headersTimeout: deleteTimeoutMs,
          bodyTimeout: deleteTimeoutMs,
        });
      } catch (error) {
        throw this.#translate(error, context, deadline, request.signal);
      }
      try {
        return await this.#interpret(response, context, {
          signal: deadline.signal,
          timeoutMs: deleteTimeoutMs,
        });
      } catch (error) {
        response.body.destroy();
        throw this.#translate(error, context, deadline, request.signal);
      }
    } finally {
      deadline.dispose();
    }
  }

  async #interpret(
    response: Dispatcher.ResponseData,
    context: { sandboxId: string; generation: number },
    exchange: Exchange,
  ): Promise<ReleaseOutcome> {
    const { statusCode } = response;
    if (statusCode === 409) {
      const text = await readLimited(response.body, MAX_RESPONSE_BODY_BYTES);
      const current = parseCurrentGeneration(text);
      if (current === undefined) {
        throw new ProvisionerBadResponseError(
          'provisioner answered 409 without a valid current_generation',
          { ...context, status: statusCode },
          ANSWERED,
        );
      }
      if (current > context.generation) return ReleaseOutcome.SUPERSEDED;
      if (current < context.generation) {
        throw new GenerationAnomalyError(
          `provisioner reports generation ${current}, older than the generation ${context.generation} being deleted`,
          { ...context, currentGeneration: current },
          ANSWERED,
        );
      }
      // The contract's 409 names ANOTHER generation ("not touched"); naming this one contradicts
      // itself, and resending the same request cannot resolve that: a dead letter with the reason.
      // The status is kept: the provisioner did answer, so nothing of the request still acts.
      throw new ProvisionerBadResponseError(
        `provisioner answered 409 naming the generation being deleted (${current}); the contract's 409 names another generation`,
        { ...context, status: statusCode, currentGeneration: current },
        ANSWERED,
      );
    }
    if (statusCode === 200) {
      const answer = await confirmationRefusal(response, context);
      if (answer === undefined) return ReleaseOutcome.DELETED;
      if (answer.notYet) {
        // The body says the delete was accepted but is not done: a 202 in a 200's clothes.
        throw new ProvisionerUnavailableError(
          `provisioner accepted the delete but has not done it yet (${answer.refusal})`,
          { ...context, status: statusCode, refusal: answer.refusal },
          STILL_ACTING,
        );
      }
      throw new ProvisionerUnconfirmedError(
        `provisioner answered 200 without confirming the delete (${answer.refusal}): not the provisioner's API at this URL? check SANDBOX_PROVISIONER_URL`,
        { ...context, status: statusCode, refusal: answer.refusal },
        ANSWERED,
      );
    }
    if (statusCode === 404 || statusCode === 410) {
      // Taken before the body is read: only a listing that starts after this may confirm it.
      const answeredAt = ++this.#ticks;
      const refusal = await absenceRefusal(response, context);
      if (refusal === undefined) {
        await this.#confirmAbsence(answeredAt, { ...context, status: statusCode }, exchange);
        return ReleaseOutcome.ABSENT;
      }
      throw new ProvisionerUnconfirmedError(
        `provisioner answered ${statusCode}, but not as the provisioner's "no such sandbox" (${refusal}): a wrong path or a missing route at this URL? check SANDBOX_PROVISIONER_URL`,
        { ...context, status: statusCode, refusal },
        ANSWERED,
      );
    }
    if (statusCode === 204) {
      await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES });
      return ReleaseOutcome.DELETED;
    }
    // An error answer may explain itself (RFC 9457 problem details, or a JSON `error`): the
    // explanation goes into the failure's reason, bounded, on one line. The status alone decides.
    const problem = await problemSummary(response);
    const explained = problem === undefined ? '' : `: ${problem}`;
    // Retry-After only on the statuses where the contract gives it meaning.
    const retryAfterSeconds =
      statusCode === 429 || statusCode === 503 ? parseRetryAfter(response.headers['retry-after']) : undefined;
    const facts = {
      ...context,
      status: statusCode,
      ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
      ...(problem !== undefined ? { problem } : {}),
    };
    if (statusCode === 429) {
      throw new ProvisionerThrottledError(`provisioner answered 429 (too many requests)${explained}`, facts, {
        retryAfterSeconds,
        ...ANSWERED,
      });
    }
    if (statusCode === 202) {
      // Accepted, not done yet: the provisioner is carrying the delete out. Retried with backoff
      // (the next attempt hears 404 once it is gone), and the scope's window is kept meanwhile.
      throw new ProvisionerUnavailableError(
        `provisioner accepted the delete but has not done it yet (202)${explained}`,
        facts,
        STILL_ACTING,
      );
    }
    if (statusCode === 408 || (statusCode >= 500 && statusCode <= 599)) {
      // A 5xx may come from a gateway whose upstream is still working on the DELETE.
      throw new ProvisionerUnavailableError(`provisioner answered ${statusCode}${explained}`, facts, {
        retryAfterSeconds,
        ...STILL_ACTING,
      });
    }
    if (statusCode >= 400 && statusCode <= 499) {
      throw new ProvisionerRejectedError(
        `provisioner rejected the delete with ${statusCode}${explained}`,
        facts,
        ANSWERED,
      );
    }
    // Any other 2xx (201, 206…), a 3xx (redirects are not
    // followed), or a status outside HTTP's 100–599 (undici passes 600–999 through): not in the
    // contract, not a confirmation, and resending will not change what this server is.
    const why =
      statusCode >= 600
        ? `a status outside HTTP's range (100-599)`
        : statusCode >= 300
          ? 'a redirect, which is not followed: check SANDBOX_PROVISIONER_URL'
          : 'a success the contract does not define as deleted';
    // Outside HTTP's range nothing says the server decided anything; any other status is an answer.
    throw new ProvisionerBadResponseError(
      `provisioner answered an unexpected status ${statusCode} (${why})${explained}`,
      facts,
      statusCode >= 600 ? STILL_ACTING : ANSWERED,
    );
  }

  #translate(
    error: unknown,
    context: Record<string, unknown>,
    deadline: Deadline,
    callerSignal: AbortSignal | undefined,
  ): CleanupError {
    // Every failure below ends a request that was (or may have been) written: the provisioner may
    // still carry it out, unless the connection was never made.
    if (callerSignal?.aborted) {
      const reason = callerSignal.reason;
      return reason instanceof CleanupError
        ? CleanupError.markMayStillAct(reason)
        : new CleanupTimeoutError('release aborted by its deadline', context, {
            cause: reason,
            ...STILL_ACTING,
          });
    }
    if (deadline.expired) {
      return new ProvisionerDeleteTimeoutError('provisioner delete timed out', context, {
        cause: error,
        ...STILL_ACTING,
      });
    }
    if (error instanceof CleanupError) return error;
    const code = (error as { code?: string })?.code ?? 'UNKNOWN';
    const message = error instanceof Error ? error.message : String(error);
    if (isNotHttp(error)) {
      // Bytes that are not an HTTP/1.1 answer (a status of four digits, or below 100; a non-HTTP
      // service at this port): this server will not answer differently next time.
      return new ProvisionerBadResponseError(
        `provisioner's answer is not valid HTTP/1.1 (${message.replace(/\s+/g, ' ').slice(0, 120)}): check SANDBOX_PROVISIONER_URL`,
        { ...context, errorCode: code },
        { cause: error, ...STILL_ACTING },
      );
    }
    return new ProvisionerConnectionError(
      `provisioner connection failed: ${code} ${message}`,
      { ...context, errorCode: code, reset: RESET_ERROR_CODES.has(code) },
      { cause: error, deleteMayStillAct: !NEVER_CONNECTED_ERROR_CODES.has(code) },
    );
  }
}

/** `promise`, or the signal's reason as soon as it aborts (the promise goes on for its other waiters). */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/** The DELETE's own bounds, which a request made on its behalf (the verification) stays within. */
interface Exchange {
  readonly signal: AbortSignal;
  readonly timeoutMs: number;
}

interface ListingAnswer {
  status?: number;
  contentType?: string;
  problem?: string;
}

/** What a listing that verified nothing answered, for the reason: its status or what was wrong with it. */
function describeListingRefusal(error: ReclaimRefusedError): string {
  const { status, contentType, problem } = error.details as ListingAnswer;
  if (typeof status !== 'number') return `200, but ${error.message}`;
  const type = contentType ? ` (${contentType})` : '';
  return `${status}${type}${problem === undefined ? '' : ` ${problem}`}`;
}

/** The verification's facts for a failure's details, beside (not over) the DELETE's own `status`. */
function verificationFacts(error: ReclaimRefusedError): Record<string, unknown> {
  const { status, contentType, problem } = error.details as ListingAnswer;
  return {
    verification: error.reason,
    ...(status !== undefined ? { listingStatus: status } : {}),
    ...(contentType !== undefined ? { listingContentType: contentType } : {}),
    ...(problem !== undefined ? { listingProblem: problem } : {}),
  };
}

/**
 * undici's parser refusing the answer (HTTPParserError), or undici's own assertion on a status
 * below 100, which the parser lets through.
 */
/** The provisioner answered and decided: nothing of this request acts any more. */
const ANSWERED = { deleteMayStillAct: false } as const;
/** The request may be at the provisioner and still be carried out (CleanupError.deleteMayStillAct). */
const STILL_ACTING = { deleteMayStillAct: true } as const;

function isNotHttp(error: unknown): boolean {
  const { name, code, message } = (error ?? {}) as { name?: unknown; code?: unknown; message?: unknown };
  if (name === 'HTTPParserError' || code === 'ERR_ASSERTION') return true;
  // undici's words for a 100 Continue or a 101 Switching Protocols that nobody asked for.
  return code === 'UND_ERR_SOCKET' && (message === 'bad response' || message === 'bad upgrade');
}

function listUnavailable(error: unknown): ReclaimRefusedError {
  const code = (error as { code?: string })?.code ?? (error as { name?: string })?.name ?? 'UNKNOWN';
  const message = error instanceof Error ? error.message : String(error);
  return new ReclaimRefusedError(
    ReclaimRefusal.LIST_UNAVAILABLE,
    `the provisioner listing failed: ${code} ${message}`,
    { errorCode: code },
    { cause: error },
  );
}

async function readLimited(
  body: Dispatcher.ResponseData['body'],
  limit: number,
): Promise<string | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > limit) {
      body.destroy();
      return undefined;
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** The media type of an answer, lower case, without parameters ('' when there is none). */
function mediaTypeOf(response: Dispatcher.ResponseData): string {
  return (headerValue(response.headers['content-type']) ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
}

function isJsonMediaType(mediaType: string): boolean {
  return mediaType === 'application/json' || mediaType.endsWith('+json');
}

function describeContentType(response: Dispatcher.ResponseData): string {
  const contentType = headerValue(response.headers['content-type']);
  return contentType === undefined
    ? 'no Content-Type'
    : `Content-Type ${JSON.stringify(contentType.slice(0, 100))} is not JSON`;
}

/** Why a 200 does not confirm the delete; `notYet` when it says the delete is still to happen. */
interface Refusal {
  readonly refusal: string;
  readonly notYet?: boolean;
}

/**
 * Why a 200 does not confirm the delete, or undefined when it does. The contract (v1.1, section
 * 3): "a 200 must carry a JSON body". The platform's provisioner answers a deleted sandbox with
 * 200, `Content-Type: application/json` and a JSON object. A 200 confirms only with both: a JSON
 * media type (`application/json` or `…+json`) AND a body (at most MAX_RESPONSE_BODY_BYTES) that
 * parses as a JSON object, which neither reports a failure nor names another sandbox or
 * generation. A catch-all web server at a wrong URL (an HTML page, an SPA's index.html), a health
 * route's empty 200, another API's array or string, or a gateway wrapping a failure in a 200 fails
 * one or the other. Refusing a real confirmation costs a dead letter with this reason; accepting a
 * false one clears a fence while its sandbox lives.
 */
async function confirmationRefusal(
  response: Dispatcher.ResponseData,
  request: { sandboxId: string; generation: number },
): Promise<Refusal | undefined> {
  const mediaType = mediaTypeOf(response);
  if (!isJsonMediaType(mediaType)) {
    // Consumed (up to the limit) rather than destroyed: destroying an unread undici body emits an
    // 'error' (AbortError) that nobody listens to, which would crash the process.
    await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES });
    return { refusal: describeContentType(response) };
  }
  const text = await readLimited(response.body, MAX_RESPONSE_BODY_BYTES);
  if (text === undefined) return { refusal: `body larger than ${MAX_RESPONSE_BODY_BYTES} bytes` };
  if (text.trim() === '') return { refusal: 'empty body' };
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return { refusal: 'body is not JSON' };
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return {
      refusal: `body is JSON ${body === null ? 'null' : Array.isArray(body) ? 'array' : typeof body}, not an object`,
    };
  }
  if (mediaType === PROBLEM_JSON) {
    return {
      refusal: `body is a problem report (${PROBLEM_JSON}), not a confirmation${problemText(body, ': ')}`,
    };
  }
  const verdict = judgeDeleteAnswer(body as Record<string, unknown>, request);
  if (!verdict?.failed) return verdict;
  return { refusal: `${verdict.refusal}${problemText(body, ': ')}` };
}

/**
 * Why a 404 or 410 is not the provisioner's "no such sandbox", or undefined when it is. The
 * contract gives a 404 no body of its own, so the provisioner's answer is one with no body or a
 * JSON one (the platform's provisioner answers `{"error": …}`). A web server or an ingress at a
 * wrong path prefix, or in front of a missing backend, answers a 404 PAGE (HTML, plain text): read
 * as "absent", it would clear every fence while every sandbox lives, with the success metrics
 * green. A JSON body that names another sandbox is not about this one either.
 */
async function absenceRefusal(
  response: Dispatcher.ResponseData,
  request: { sandboxId: string; generation: number },
): Promise<string | undefined> {
  const mediaType = mediaTypeOf(response);
  const text = await readLimited(response.body, MAX_RESPONSE_BODY_BYTES);
  if (text === undefined) return `body larger than ${MAX_RESPONSE_BODY_BYTES} bytes`;
  if (text.trim() === '') return undefined;
  if (!isJsonMediaType(mediaType)) return `a body with ${describeContentType(response)}`;
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return 'body is not JSON';
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
  const record = body as Record<string, unknown>;
  return record.sandbox_id !== undefined && record.sandbox_id !== request.sandboxId
    ? `body names sandbox ${JSON.stringify(String(record.sandbox_id).slice(0, 80))}, not the one being deleted`
    : undefined;
}

/** RFC 9457: the media type of an error report, whatever the status says. */
const PROBLEM_JSON = 'application/problem+json';

const MAX_PROBLEM_LENGTH = 200;

/**
 * The explanation an error answer carries, as one bounded line (undefined when it has none): the
 * problem details' `title` and `detail` (RFC 9457), or a JSON `error`/`message`. Read only from
 * a JSON body of at most MAX_RESPONSE_BODY_BYTES; anything else is drained and ignored.
 */
async function problemSummary(response: Dispatcher.ResponseData): Promise<string | undefined> {
  if (!isJsonMediaType(mediaTypeOf(response))) {
    await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES });
    return undefined;
  }
  const text = await readLimited(response.body, MAX_RESPONSE_BODY_BYTES);
  if (text === undefined) return undefined;
  try {
    return problemText(JSON.parse(text)) || undefined;
  } catch {
    return undefined;
  }
}

function problemText(body: unknown, prefix = ''): string {
  if (typeof body !== 'object' || body === null) return '';
  const record = body as Record<string, unknown>;
  const error =
    typeof record.error === 'object' && record.error !== null
      ? (record.error as Record<string, unknown>)
      : {};
  const parts = [record.title, record.detail, record.error, record.message, error.message, error.code]
    .filter((part): part is string | number => typeof part === 'string' || typeof part === 'number')
    .map((part) => String(part).trim())
    .filter((part) => part !== '');
  if (parts.length === 0) return '';
  // One line, no control characters: it becomes a log field and a dead letter's reason.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: removing them is the point
  const line = [...new Set(parts)].join(' — ').replace(/[\u0000-\u001f\u007f]+/g, ' ');
  return (
    prefix + JSON.stringify(line.length > MAX_PROBLEM_LENGTH ? `${line.slice(0, MAX_PROBLEM_LENGTH)}…` : line)
  );
}

function headerValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value.join(', ') : value;
}

function parseCurrentGeneration(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  try {
    const value = (JSON.parse(text) as { current_generation?: unknown })?.current_generation;
    const generation = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
    return typeof generation === 'number' && Number.isSafeInteger(generation) && generation >= 0
      ? generation
      : undefined;
  } catch {
    return undefined;
  }
}
