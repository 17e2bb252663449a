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
  ProvisionerUnavailableError,
} from '../cleanup/errors.ts';
import type { DeleteSandboxRequest, SandboxDeleteClient } from '../cleanup/sandbox-provider.ts';
import { ReleaseOutcome } from '../cleanup/types.ts';

/**
 * The provisioner's `DELETE /api/sandboxes/{id}?generation=G` over undici, with the contract's
 * reply semantics (contract.md, section 3):
 *
 *   200 deleted · 404 absent · 409 {current_generation: N}: N > G superseded (success), N < G
 *   anomaly · 5xx, connection errors, timeouts retryable · other 4xx non-retryable.
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
    await response.body.dump({ limit: MAX_RESPONSE_BODY_BYTES });
    if (statusCode === 200 || statusCode === 204) return ReleaseOutcome.DELETED;
    if (statusCode === 404) return ReleaseOutcome.ABSENT;
    if (statusCode >= 500 && statusCode <= 599) {
      throw new ProvisionerUnavailableError(`provisioner answered ${statusCode}`, {
        ...context,
        status: statusCode,
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
