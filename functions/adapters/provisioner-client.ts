import { Agent, type Dispatcher } from 'undici';
import {
  CleanupError,
  CleanupTimeoutError,
  GenerationAnomalyError,
  InvalidMessageError,
  ProvisionerBadResponseError,
  ProvisionerConnectionError,
  ProvisionerDeleteTimeoutError,
  ProvisionerRejectedError,
  ProvisionerThrottledError,
  ProvisionerUnavailableError,
  ProvisionerUnconfirmedError,
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
import { parseRetryAfter } from './retry-after.ts';

/**
 * The provisioner's `DELETE /api/sandboxes/{id}?generation=G` over undici, with the contract's
 * reply semantics (v1.1, section 3):
 *
 *   200 with a JSON object, or 204: deleted · 404, 410: absent (gone) · 409 {current_generation:
 *   N}: N > G superseded (success), N < G anomaly · 408, 429, 5xx, connection errors, timeouts
 *   retryable, a 429's or 503's Retry-After carried to the consumer · a 200 without a JSON object
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

/** Rejects ids that a URL parser could turn into a different path (dot segments, controls). */
export function assertSafeSandboxId(sandboxId: string): void {
  if (
    sandboxId.length === 0 ||
    sandboxId.length > 512 ||
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

export class ProvisionerClient implements SandboxDeleteClient {
  readonly #origin: string;
  readonly #basePath: string;
  readonly #dispatcher: Dispatcher;

  constructor(baseUrl: string, dispatcher?: Dispatcher) {
    const url = new URL(baseUrl);
    this.#origin = url.origin;
    this.#basePath = url.pathname.replace(/\/+$/, '');
    // Short keep-alive: a socket idle for longer is more likely dead than reusable.
    this.#dispatcher = dispatcher ?? new Agent({ keepAliveTimeout: 4_000, connections: 64 });
  }

  async deleteSandbox(request: DeleteSandboxRequest): Promise<ReleaseOutcome> {
    assertSafeSandboxId(request.sandboxId);
    try {
      return await this.#deleteOnce(request);
    } catch (error) {
      // One immediate retry for a reset before any answer: the delete is idempotent by generation.
      if (error instanceof ProvisionerConnectionError && error.details.reset && !request.signal?.aborted) {
        return this.#deleteOnce(request);
      }
      throw error;
    }
  }

  async close(): Promise<void> {
    await this.#dispatcher.close();
  }

  /**
   * `GET /api/sandboxes` (contract v1.1 section 3), for the reclaimer only. Bounded in time
   * (`timeoutMs`, headers and body) and in size (MAX_LIST_BODY_BYTES); any reply that is not a
   * complete, well-formed listing throws ReclaimRefusedError with its reason, so the run deletes
   * nothing (reclaim-listing.ts).
   */
  async listSandboxes(options: { timeoutMs: number; signal?: AbortSignal }): Promise<ListedSandbox[]> {
    const timeout = AbortSignal.timeout(options.timeoutMs);
    const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
    let response: Dispatcher.ResponseData;
    try {
      response = await this.#dispatcher.request({
        origin: this.#origin,
        path: `${this.#basePath}/api/sandboxes`,
        method: 'GET',
        headers: { accept: 'application/json' },
        signal,
        headersTimeout: options.timeoutMs,
        bodyTimeout: options.timeoutMs,
      });
    } catch (error) {
      throw listUnavailable(error);
    }
    const { statusCode } = response;
    if (statusCode !== 200) {
      await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES }).catch(() => {});
      const retryable = statusCode === 408 || statusCode === 429 || (statusCode >= 500 && statusCode <= 599);
      throw new ReclaimRefusedError(
        retryable ? ReclaimRefusal.LIST_UNAVAILABLE : ReclaimRefusal.LIST_REJECTED,
        `the provisioner answered the listing with ${statusCode}`,
        { status: statusCode },
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

  async #deleteOnce(request: DeleteSandboxRequest): Promise<ReleaseOutcome> {
    const { sandboxId, generation, deleteTimeoutMs } = request;
    const deleteTimeout = AbortSignal.timeout(deleteTimeoutMs);
    const signal = request.signal ? AbortSignal.any([request.signal, deleteTimeout]) : deleteTimeout;
    const path = `${this.#basePath}/api/sandboxes/${encodeURIComponent(sandboxId)}?generation=${generation}`;
    const context = { sandboxId, generation };
    let response: Dispatcher.ResponseData;
    try {
      response = await this.#dispatcher.request({
        origin: this.#origin,
        path,
        method: 'DELETE',
        signal,
        headersTimeout: deleteTimeoutMs,
        bodyTimeout: deleteTimeoutMs,
      });
    } catch (error) {
      throw this.#translate(error, context, deleteTimeout, request.signal);
    }
    try {
      return await this.#interpret(response, context);
    } catch (error) {
      response.body.destroy();
      throw this.#translate(error, context, deleteTimeout, request.signal);
    }
  }

  async #interpret(
    response: Dispatcher.ResponseData,
    context: { sandboxId: string; generation: number },
  ): Promise<ReleaseOutcome> {
    const { statusCode } = response;
    if (statusCode === 409) {
      const text = await readLimited(response.body, MAX_RESPONSE_BODY_BYTES);
      const current = parseCurrentGeneration(text);
      if (current === undefined) {
        throw new ProvisionerBadResponseError('provisioner answered 409 without a valid current_generation', {
          ...context,
          status: statusCode,
        });
      }
      if (current > context.generation) return ReleaseOutcome.SUPERSEDED;
      if (current < context.generation) {
        throw new GenerationAnomalyError(
          `provisioner reports generation ${current}, older than the generation ${context.generation} being deleted`,
          { ...context, currentGeneration: current },
        );
      }
      throw new ProvisionerBadResponseError('provisioner answered 409 naming the generation being deleted', {
        ...context,
        currentGeneration: current,
      });
    }
    if (statusCode === 200) {
      const refusal = await confirmationRefusal(response);
      if (refusal === undefined) return ReleaseOutcome.DELETED;
      throw new ProvisionerUnconfirmedError(
        `provisioner answered 200 without confirming the delete (${refusal}): not the provisioner's API at this URL? check SANDBOX_PROVISIONER_URL`,
        { ...context, status: statusCode, refusal },
      );
    }
    await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES });
    if (statusCode === 204) return ReleaseOutcome.DELETED;
    if (statusCode === 404 || statusCode === 410) return ReleaseOutcome.ABSENT;
    // Retry-After only on the statuses where the contract gives it meaning.
    const retryAfterSeconds =
      statusCode === 429 || statusCode === 503 ? parseRetryAfter(response.headers['retry-after']) : undefined;
    const facts = {
      ...context,
      status: statusCode,
      ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
    };
    if (statusCode === 429) {
      throw new ProvisionerThrottledError(`provisioner answered 429 (too many requests)`, facts, {
        retryAfterSeconds,
      });
    }
    if (statusCode === 408 || (statusCode >= 500 && statusCode <= 599)) {
      throw new ProvisionerUnavailableError(`provisioner answered ${statusCode}`, facts, {
        retryAfterSeconds,
      });
    }
    if (statusCode >= 400 && statusCode <= 499) {
      throw new ProvisionerRejectedError(`provisioner rejected the delete with ${statusCode}`, {
        ...context,
        status: statusCode,
      });
    }
    throw new ProvisionerBadResponseError(`provisioner answered an unexpected status ${statusCode}`, {
      ...context,
      status: statusCode,
    });
  }

  #translate(
    error: unknown,
    context: Record<string, unknown>,
    deleteTimeout: AbortSignal,
    callerSignal: AbortSignal | undefined,
  ): CleanupError {
    if (callerSignal?.aborted) {
      const reason = callerSignal.reason;
      return reason instanceof CleanupError
        ? reason
        : new CleanupTimeoutError('release aborted by its deadline', context, { cause: reason });
    }
    if (deleteTimeout.aborted) {
      return new ProvisionerDeleteTimeoutError('provisioner delete timed out', context, { cause: error });
    }
    if (error instanceof CleanupError) return error;
    const code = (error as { code?: string })?.code ?? 'UNKNOWN';
    const message = error instanceof Error ? error.message : String(error);
    return new ProvisionerConnectionError(
      `provisioner connection failed: ${code} ${message}`,
      { ...context, errorCode: code, reset: RESET_ERROR_CODES.has(code) },
      { cause: error },
    );
  }
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

/**
 * Why a 200 does not confirm the delete, or undefined when it does. The platform's provisioner
 * answers a deleted sandbox with 200, `Content-Type: application/json` and a JSON object. A 200
 * confirms only with both: a JSON media type (`application/json` or `…+json`) AND a body (at most
 * MAX_RESPONSE_BODY_BYTES) that parses as a JSON object. A catch-all web server at a wrong URL
 * (an HTML page, an SPA's index.html), a health route's empty 200, or another API's array or
 * string fails one or the other. Refusing a real confirmation costs a dead letter with this
 * reason; accepting a false one clears a fence while its sandbox lives.
 */
async function confirmationRefusal(response: Dispatcher.ResponseData): Promise<string | undefined> {
  const contentType = headerValue(response.headers['content-type']);
  const mediaType = (contentType ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  if (mediaType !== 'application/json' && !mediaType.endsWith('+json')) {
    // Consumed (up to the limit) rather than destroyed: destroying an unread undici body emits an
    // 'error' (AbortError) that nobody listens to, which would crash the process.
    await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES });
    return contentType === undefined
      ? 'no Content-Type'
      : `Content-Type ${JSON.stringify(contentType.slice(0, 100))} is not JSON`;
  }
  const text = await readLimited(response.body, MAX_RESPONSE_BODY_BYTES);
  if (text === undefined) return `body larger than ${MAX_RESPONSE_BODY_BYTES} bytes`;
  if (text.trim() === '') return 'empty body';
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return 'body is not JSON';
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return `body is JSON ${body === null ? 'null' : Array.isArray(body) ? 'array' : typeof body}, not an object`;
  }
  return undefined;
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
