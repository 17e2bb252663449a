import { timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  type ApiAnswer,
  type CreateSandboxBody,
  createSandbox,
  deleteSandbox,
  getSandbox,
  listSandboxes,
  parseCreateSandboxBody,
  type SandboxUrlOf,
} from './api.ts';
import type { AuditLog } from './audit.ts';
import type { FaultDecision, FaultTable, RetryAfterFault } from './faults.ts';
import {
  pause,
  readJsonBody,
  resetConnection,
  sendError,
  sendJson,
  sendJsonSlowly,
  sendOversizedJson,
  sendText,
  sendUnknownRoute,
} from './http-io.ts';
import { parseRoute, type Route } from './routes.ts';
import type { SandboxRegistry } from './sandboxes.ts';
import {
  type ApiMethod,
  AUDIT_OUTCOME,
  type AuditEntry,
  type ProvisionerMode,
  type RequestInfo,
  type RequestListener,
} from './types.ts';

/** One API request being handled. */
export interface ApiRequest {
  readonly entry: AuditEntry;
  readonly request: IncomingMessage;
  /** Aborted when the client leaves or the provisioner stops: waits end, the sandbox is left alone. */
  readonly abort: AbortController;
  /** Held by a `hang` fault right now (so `stop` can record the outcome `hung`). */
  hanging: boolean;
}

export interface PipelineDependencies {
  readonly registry: SandboxRegistry;
  readonly faults: FaultTable;
  readonly audit: AuditLog;
  readonly listeners: ReadonlySet<RequestListener>;
  readonly urlOf: SandboxUrlOf;
  readonly mode: ProvisionerMode;
  /**
   * The mode one sandbox's DELETE and listing entry are served in: the provisioner's own, unless a test put that
   * sandbox in the other (the chaos suite serves one scope as the platform's provisioner would).
   */
  readonly modeOf?: (sandboxId: string) => ProvisionerMode;
  /** When set, every API request must carry `Authorization: Bearer <token>`; others get a 401. */
  readonly token?: string;
  /** Hooks awaited before a DELETE answered earlier (`deleteAfterMs`) is carried out. */
  readonly deferredListeners?: ReadonlySet<RequestListener>;
}

/**
 * Serves one sandbox API request in phases: identify (route, body, audit announcement) →
 * `onRequest` hooks → fault before handling (latency, hang, error, conflict, reset) → the
 * real operation → send (normally, oversized, slowly, or reset after handling). Once the
 * client has gone, no later phase starts: a request abandoned during a latency or a hang
 * never touches its sandbox, while an operation already under way runs to completion so
 * no sandbox is ever left half-deleted.
 */
export function createApiPipeline(deps: PipelineDependencies) {
  const { registry, faults, audit, listeners, urlOf, mode } = deps;
  const modeOf = deps.modeOf ?? (() => mode);
  /** DELETEs answered and still to be carried out (`deleteAfterMs`); cancelled at stop. */
  const deferred = new Set<NodeJS.Timeout>();

  async function serve(api: ApiRequest, response: ServerResponse, query: URLSearchParams): Promise<void> {
    const { entry, request } = api;
    const signal = api.abort.signal;
    try {
      const route = parseRoute(entry.method, entry.path, query);
      const createBody =
        route.kind === 'create-sandbox' ? parseCreateSandboxBody(await readJsonBody(request)) : undefined;
      const sandboxId = createBody?.sandbox_id ?? ('sandboxId' in route ? route.sandboxId : undefined);
      if (sandboxId !== undefined) entry.sandboxId = sandboxId;
      if (route.kind === 'delete-sandbox' && route.generation !== undefined) {
        entry.generation = route.generation;
      }
      audit.announce(entry);
      if (route.kind === 'not-found') return sendUnknownRoute(response, entry.method, entry.path);
      if (route.kind === 'method-not-allowed') {
        response.setHeader('allow', route.allow.join(', '));
        return sendJson(response, 405, { error: 'method not allowed' });
      }
      if (deps.token !== undefined && !carriesBearer(request, deps.token)) {
        // As RFC 6750 answers a missing or wrong token; the request does nothing.
        return sendJson(
          response,
          401,
          { error: 'missing or invalid bearer token' },
          { 'www-authenticate': 'Bearer realm="sandbox-provisioner"' },
        );
      }

      const info = { method: entry.method, sandboxId, generation: entry.generation };
      for (const listener of listeners) await listener(info);
      if (signal.aborted) return;

      const decision = faults.pick(entry.method as ApiMethod, sandboxId);
      if (decision) entry.fault = decision.label;
      if (!(await applyFaultBeforeHandling(api, response, decision))) {
        if (decision?.action.kind === 'status' && decision.action.deleteAfterMs !== undefined) {
          if (route.kind === 'delete-sandbox') deleteLater(entry, route, info, decision.action.deleteAfterMs);
        }
        return;
      }

      const answer = await answerRoute(route, createBody);
      if (answer.deletedGeneration !== undefined) {
        entry.deletedGeneration = answer.deletedGeneration;
        entry.deletedAt = performance.timeOrigin + performance.now();
      }
      if (signal.aborted) return;
      await sendAnswer(api, response, answer, decision);
    } catch (error) {
      if (!signal.aborted) sendError(response, error);
    }
  }

  /** Returns whether the request goes on to be handled. */
  async function applyFaultBeforeHandling(
    api: ApiRequest,
    response: ServerResponse,
    decision: FaultDecision | undefined,
  ): Promise<boolean> {
    const signal = api.abort.signal;
    switch (decision?.action.kind) {
      case undefined:
        return true;
      case 'latency':
        if (decision.action.completeIfAbandoned) {
          const { ms } = decision.action;
          await new Promise((resolve) => setTimeout(resolve, ms));
          return true;
        }
        return pause(decision.action.ms, signal);
      case 'hang': {
        api.hanging = true;
        const outcome = await faults.waitForRelease(decision.source, signal);
        api.hanging = false;
        return outcome === 'released';
      }
      case 'status': {
        const { status, body, contentType, retryAfter } = decision.action;
        const headers: Record<string, string> = {};
        if (retryAfter !== undefined) {
          const asked = retryAfterHeader(retryAfter);
          headers['retry-after'] = asked.value;
          api.entry.retryAfter = asked.value;
          if (asked.askedMs !== undefined) api.entry.retryAfterAskedMs = asked.askedMs;
        }
        if (body === undefined && contentType === undefined) {
          sendJson(response, status, { error: `injected fault: status ${status}` }, headers);
        } else {
          sendText(response, status, body ?? '', { contentType, headers });
        }
        return false;
      }
      case 'conflict':
        sendJson(response, 409, { current_generation: decision.action.currentGeneration });
        return false;
      case 'reset':
        if (decision.action.afterHandling) return true;
        audit.finish(api.entry, AUDIT_OUTCOME.reset);
        resetConnection(api.request);
        return false;
      default:
        return true;
    }
  }

  /**
   * Carries a DELETE out `ms` after it was answered, whether or not its client still listens: the
   * provisioner that answered 202 keeps its word later. The audit entry says when.
   */
  function deleteLater(
    entry: AuditEntry,
    route: Extract<Route, { kind: 'delete-sandbox' }>,
    info: RequestInfo,
    ms: number,
  ): void {
    const timer = setTimeout(() => {
      deferred.delete(timer);
      void (async () => {
        for (const listener of deps.deferredListeners ?? []) await listener(info);
        const answer = await deleteSandbox(
          registry,
          route.sandboxId,
          route.generation,
          modeOf(route.sandboxId),
        );
        if (answer.deletedGeneration !== undefined) {
          entry.deletedGeneration = answer.deletedGeneration;
          entry.deletedAt = performance.timeOrigin + performance.now();
        }
      })().catch(() => {});
    }, ms);
    deferred.add(timer);
  }

  async function answerRoute(route: Route, createBody: CreateSandboxBody | undefined): Promise<ApiAnswer> {
    switch (route.kind) {
      case 'create-sandbox':
        return createSandbox(registry, createBody!, urlOf);
      case 'get-sandbox':
        return getSandbox(registry, route.sandboxId, urlOf);
      case 'list-live-sandboxes':
        return listSandboxes(registry, urlOf, modeOf);
      case 'delete-sandbox':
        return deleteSandbox(registry, route.sandboxId, route.generation, modeOf(route.sandboxId));
      default:
        return { status: 404, body: { error: 'not found' } };
    }
  }

  async function sendAnswer(
    api: ApiRequest,
    response: ServerResponse,
    answer: ApiAnswer,
    decision: FaultDecision | undefined,
  ): Promise<void> {
    const signal = api.abort.signal;
    switch (decision?.action.kind) {
      case 'oversized':
        return sendOversizedJson(response, answer.status, answer.body, decision.action.bytes, signal);
      case 'slow-body':
        return sendJsonSlowly(response, answer.status, answer.body, decision.action.ms, signal);
      case 'reset':
        audit.finish(api.entry, AUDIT_OUTCOME.reset);
        return resetConnection(api.request);
      case 'gone':
        if (answer.status === 200 || answer.status === 404) {
          return sendJson(response, 410, { error: 'gone', sandbox_id: api.entry.sandboxId });
        }
        return sendJson(response, answer.status, answer.body);
      default:
        return sendJson(response, answer.status, answer.body);
    }
  }

  /** Drops the deletes still to be carried out (the provisioner is stopping). */
  function cancelDeferred(): void {
    for (const timer of deferred) clearTimeout(timer);
    deferred.clear();
  }

  return { serve, cancelDeferred };
}

/** Whether the request's Authorization header is `Bearer <token>` (compared in constant time). */
function carriesBearer(request: IncomingMessage, token: string): boolean {
  const header = request.headers.authorization ?? '';
  const match = /^Bearer +(\S+)\s*$/i.exec(header);
  if (!match) return false;
  const given = Buffer.from(match[1]!, 'utf8');
  const expected = Buffer.from(token, 'utf8');
  return given.length === expected.length && timingSafeEqual(given, expected);
}

/**
 * The header value of a Retry-After fault, and how long it asks the client to wait from the
 * answer (not known for a raw value, which may be anything). An HTTP-date is computed at the
 * moment of the answer.
 */
function retryAfterHeader(retryAfter: RetryAfterFault): { value: string; askedMs?: number } {
  if (typeof retryAfter === 'string') return { value: retryAfter };
  if (retryAfter.as === 'delta-seconds') {
    return { value: String(retryAfter.seconds), askedMs: retryAfter.seconds * 1000 };
  }
  // toUTCString() writes IMF-fixdate, the preferred HTTP-date form. It drops the milliseconds, so
  // round up to the next whole second: the date must not ask for less than `seconds`.
  const now = Date.now();
  const until = Math.ceil(now / 1000) * 1000 + retryAfter.seconds * 1000;
  return { value: new Date(until).toUTCString(), askedMs: until - now };
}
