import { mkdir } from 'node:fs/promises';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import {
  type ApiAnswer,
  createSandbox,
  deleteSandbox,
  getSandbox,
  parseCreateSandboxBody,
  type SandboxUrlOf,
} from './api.ts';
import { AuditLog } from './audit.ts';
import { handleControl } from './control.ts';
import { ProvisionerError } from './errors.ts';
import { type Fault, type FaultDecision, type FaultProfile, FaultTable } from './faults.ts';
import {
  pause,
  readJsonBody,
  resetConnection,
  sendJson,
  sendJsonSlowly,
  sendOversizedJson,
  sendText,
} from './http-io.ts';
import { parseRoute, type Route, splitTarget } from './routes.ts';
import { isProcessAlive, SandboxRegistry } from './sandboxes.ts';
import {
  type ApiMethod,
  AUDIT_OUTCOME,
  type AuditEntry,
  type RequestListener,
  type SandboxInfo,
} from './types.ts';

export type { Fault, FaultProfile } from './faults.ts';
export { isProcessAlive } from './sandboxes.ts';
export type { AuditEntry, AuditOutcome, RequestInfo, RequestListener, SandboxInfo } from './types.ts';

/** Options of `startProvisioner`. */
export interface ProvisionerOptions {
  /** 0 (the default) picks a free port. */
  readonly port?: number;
  /** Defaults to 127.0.0.1: the provisioner kills processes on request and must not be reachable from outside. */
  readonly host?: string;
  /** Where sandbox work directories are created; created if missing. */
  readonly rootDir: string;
  /** Time between SIGTERM and SIGKILL when a sandbox is stopped; default 2000. */
  readonly graceMs?: number;
  /** Seed of the PRNG behind fault probabilities and the fault profile; default 1. */
  readonly seed?: number;
  /** Audit entries kept (oldest dropped first); default 10 000. */
  readonly auditLimit?: number;
  /** Sandboxes ignore SIGTERM, so every stop takes the grace period and ends in SIGKILL. */
  readonly sandboxIgnoresSigterm?: boolean;
}

/** A running local provisioner (contract §3) whose sandboxes are real child processes. */
export interface LocalProvisioner {
  /** `http://127.0.0.1:<port>`, the base URL for the provisioner client. */
  readonly url: string;
  readonly port: number;
  readonly rootDir: string;
  /** Adds a fault for a sandbox id, or for every request with `'*'`. */
  setFault(target: string, fault: Fault): void;
  /** Removes every fault (or those of `target`) and the profile; hung requests they hold are then handled normally. */
  clearFaults(target?: string): void;
  /** Sets (or with `undefined` removes) the random fault mix used for requests no fault claimed. */
  setFaultProfile(profile: FaultProfile | undefined): void;
  /** A copy of the audit log, oldest first. */
  audit(): AuditEntry[];
  /** API requests neither answered, aborted, reset nor given up at stop. */
  inFlight(): number;
  /** Resolves with the first request matching `predicate` that is in flight or arrives next, before it is handled. */
  waitForRequest(predicate: (entry: AuditEntry) => boolean, timeoutMs: number): Promise<AuditEntry>;
  /** Registers a hook awaited on each sandbox API request before it is handled; returns its remover. */
  onRequest(listener: RequestListener): () => void;
  /** The live sandbox of this id. */
  sandbox(sandboxId: string): SandboxInfo | undefined;
  liveSandboxes(): SandboxInfo[];
  isProcessAlive(pid: number): boolean;
  /** Deletes every live sandbox; returns how many. */
  deleteAll(): Promise<number>;
  /** Ends hung requests, kills every sandbox and waits for the exits, closes the server. */
  stop(): Promise<void>;
}

/** One API request being handled. */
interface RequestContext {
  readonly entry: AuditEntry;
  readonly request: IncomingMessage;
  /** Aborted when the client leaves or the provisioner stops: waits end, the sandbox is left alone. */
  readonly abort: AbortController;
  hanging: boolean;
}

/** Starts a provisioner; it listens before this resolves. */
export async function startProvisioner(options: ProvisionerOptions): Promise<LocalProvisioner> {
  const rootDir = resolve(options.rootDir);
  await mkdir(rootDir, { recursive: true });
  const registry = new SandboxRegistry({
    rootDir,
    graceMs: options.graceMs ?? 2000,
    sandboxIgnoresSigterm: options.sandboxIgnoresSigterm ?? false,
  });
  const faults = new FaultTable(options.seed ?? 1);
  const audit = new AuditLog(options.auditLimit ?? 10_000);
  const listeners = new Set<RequestListener>();
  const active = new Set<RequestContext>();
  let baseUrl = '';
  const urlOf: SandboxUrlOf = (sandboxId) => `${baseUrl}/sandboxes/${encodeURIComponent(sandboxId)}`;

  const server = createServer((request, response) => {
    // An aborted upload emits 'error' on the request; unheard, it would crash the provisioner.
    request.on('error', () => {});
    const { path, query } = splitTarget(request.url);
    if (path.startsWith('/_control/')) {
      void serveControl(request, response, path, query);
      return;
    }
    const context: RequestContext = {
      entry: audit.open(request.method ?? '', path),
      request,
      abort: new AbortController(),
      hanging: false,
    };
    active.add(context);
    trackOutcome(context, response);
    void serveApi(context, response, query);
  });

  async function serveControl(
    request: IncomingMessage,
    response: ServerResponse,
    path: string,
    query: URLSearchParams,
  ): Promise<void> {
    try {
      await handleControl(parseRoute(request.method ?? '', path, query), request, response, {
        faults,
        audit,
        registry,
      });
    } catch (error) {
      sendError(response, error);
    }
  }

  function trackOutcome(context: RequestContext, response: ServerResponse): void {
    const { entry } = context;
    response.on('finish', () => {
      entry.status = response.statusCode;
      audit.finish(entry, AUDIT_OUTCOME.answered);
    });
    response.on('close', () => {
      active.delete(context);
      if (response.headersSent) entry.status = response.statusCode;
      // Runs first for reset and stop (they finish the entry themselves); then this is a no-op.
      audit.finish(entry, AUDIT_OUTCOME.aborted);
      context.abort.abort();
    });
  }

  async function serveApi(context: RequestContext, response: ServerResponse, query: URLSearchParams) {
    const { entry, request } = context;
    const signal = context.abort.signal;
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
      if (route.kind === 'not-found') return sendJson(response, 404, { error: 'not found' });
      if (route.kind === 'method-not-allowed') {
        response.setHeader('allow', route.allow.join(', '));
        return sendJson(response, 405, { error: 'method not allowed' });
      }

      const info = { method: entry.method, sandboxId, generation: entry.generation };
      for (const listener of listeners) await listener(info);
      if (signal.aborted) return;

      const decision = faults.pick(entry.method as ApiMethod, sandboxId);
      if (decision) entry.fault = decision.label;
      if (!(await applyFaultBeforeHandling(context, response, decision))) return;

      const answer = await answerRoute(route, createBody);
      if (answer.deletedGeneration !== undefined) entry.deletedGeneration = answer.deletedGeneration;
      if (signal.aborted) return;
      await sendAnswer(context, response, answer, decision);
    } catch (error) {
      if (!signal.aborted) sendError(response, error);
    }
  }

  /** Returns whether the request should go on to be handled. */
  async function applyFaultBeforeHandling(
    context: RequestContext,
    response: ServerResponse,
    decision: FaultDecision | undefined,
  ): Promise<boolean> {
    const signal = context.abort.signal;
    switch (decision?.action.kind) {
      case undefined:
        return true;
      case 'latency':
        return pause(decision.action.ms, signal);
      case 'hang': {
        context.hanging = true;
        const outcome = await faults.waitForRelease(decision.source, signal);
        context.hanging = false;
        return outcome === 'released';
      }
      case 'status': {
        const { status, body } = decision.action;
        if (body === undefined) sendJson(response, status, { error: `injected fault: status ${status}` });
        else sendText(response, status, body);
        return false;
      }
      case 'conflict':
        sendJson(response, 409, { current_generation: decision.action.currentGeneration });
        return false;
      case 'reset':
        if (decision.action.afterHandling) return true;
        audit.finish(context.entry, AUDIT_OUTCOME.reset);
        resetConnection(context.request);
        return false;
      default:
        return true;
    }
  }

  function answerRoute(route: Route, createBody: ReturnType<typeof parseCreateSandboxBody> | undefined) {
    switch (route.kind) {
      case 'create-sandbox':
        return createSandbox(registry, createBody!, urlOf);
      case 'get-sandbox':
        return Promise.resolve(getSandbox(registry, route.sandboxId, urlOf));
      case 'delete-sandbox':
        return deleteSandbox(registry, route.sandboxId, route.generation);
      default:
        return Promise.resolve<ApiAnswer>({ status: 404, body: { error: 'not found' } });
    }
  }

  async function sendAnswer(
    context: RequestContext,
    response: ServerResponse,
    answer: ApiAnswer,
    decision: FaultDecision | undefined,
  ): Promise<void> {
    const signal = context.abort.signal;
    switch (decision?.action.kind) {
      case 'oversized':
        return sendOversizedJson(response, answer.status, answer.body, decision.action.bytes, signal);
      case 'slow-body':
        return sendJsonSlowly(response, answer.status, answer.body, decision.action.ms, signal);
      case 'reset':
        audit.finish(context.entry, AUDIT_OUTCOME.reset);
        return resetConnection(context.request);
      default:
        return sendJson(response, answer.status, answer.body);
    }
  }

  let stopped: Promise<void> | undefined;
  async function stop(): Promise<void> {
    const closed = new Promise<void>((done) => server.close(() => done()));
    for (const context of active) {
      if (context.hanging) audit.finish(context.entry, AUDIT_OUTCOME.hung);
      context.abort.abort();
      context.request.socket.destroy();
    }
    server.closeAllConnections();
    await registry.stop();
    await closed;
  }

  await new Promise<void>((listening, failed) => {
    server.once('error', failed);
    server.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => {
      server.off('error', failed);
      listening();
    });
  });
  const { address, port } = server.address() as AddressInfo;
  baseUrl = `http://${address.includes(':') ? `[${address}]` : address}:${port}`;

  return {
    url: baseUrl,
    port,
    rootDir,
    setFault: (target, fault) => faults.set(target, fault),
    clearFaults: (target) => faults.clear(target),
    setFaultProfile: (profile) => faults.setProfile(profile),
    audit: () => audit.entries(),
    inFlight: () => audit.inFlight(),
    waitForRequest: (predicate, timeoutMs) => audit.waitForArrival(predicate, timeoutMs),
    onRequest(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    sandbox: (sandboxId) => registry.get(sandboxId),
    liveSandboxes: () => registry.list(),
    isProcessAlive,
    deleteAll: () => registry.deleteAll(),
    stop() {
      stopped ??= stop();
      return stopped;
    },
  };
}

function sendError(response: ServerResponse, error: unknown): void {
  if (response.headersSent || response.destroyed) return;
  const status = error instanceof ProvisionerError ? error.httpStatus : 500;
  const message = error instanceof Error ? error.message : String(error);
  sendJson(response, status, { error: message });
}
