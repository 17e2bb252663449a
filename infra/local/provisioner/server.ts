import { mkdir } from 'node:fs/promises';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { z } from 'zod';
import type { SandboxUrlOf } from './api.ts';
import { AuditLog } from './audit.ts';
import { handleControl } from './control.ts';
import { type Fault, type FaultProfile, FaultTable } from './faults.ts';
import { sendError } from './http-io.ts';
import { type ApiRequest, createApiPipeline } from './pipeline.ts';
import { parseRoute, splitTarget } from './routes.ts';
import { isProcessAlive, SandboxRegistry } from './sandboxes.ts';
import {
  AUDIT_OUTCOME,
  type AuditEntry,
  PROVISIONER_MODE,
  type ProvisionerMode,
  type RequestListener,
  type SandboxInfo,
} from './types.ts';

export type { Fault, FaultProfile } from './faults.ts';
export { isProcessAlive } from './sandboxes.ts';
export type {
  AuditEntry,
  AuditOutcome,
  ProvisionerMode,
  RequestInfo,
  RequestListener,
  SandboxInfo,
} from './types.ts';
export { PROVISIONER_MODE } from './types.ts';

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
  /** `contract` (the default) or `platform`: see `ProvisionerMode`. */
  readonly mode?: ProvisionerMode;
  /**
   * A bearer token every sandbox API request must carry (`Authorization: Bearer <token>`), else
   * 401; the `/_control/` routes stay open (they steer tests, on loopback only). Unset: no check.
   */
  readonly token?: string;
}

/** A running local provisioner (contract §3) whose sandboxes are real child processes. */
export interface LocalProvisioner {
  /** `http://127.0.0.1:<port>`, the base URL for the provisioner client. */
  readonly url: string;
  readonly port: number;
  readonly rootDir: string;
  readonly mode: ProvisionerMode;
  /**
   * Serves the DELETEs and the listing entry of one sandbox id in another mode than the
   * provisioner's (undefined goes back to the provisioner's own): the chaos suite puts one scope
   * behind the platform's generation-blind DELETE and generation-less listing while the rest keeps
   * the contract's.
   */
  setSandboxMode(sandboxId: string, mode: ProvisionerMode | undefined): void;
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
  /**
   * Registers a hook awaited before a DELETE answered earlier (a `status` fault with
   * `deleteAfterMs`) is carried out: the moment the sandbox really goes; returns its remover.
   */
  onDeferredDelete(listener: RequestListener): () => void;
  /** The live sandbox of this id. */
  sandbox(sandboxId: string): SandboxInfo | undefined;
  liveSandboxes(): SandboxInfo[];
  isProcessAlive(pid: number): boolean;
  /** Deletes every live sandbox; returns how many. */
  deleteAll(): Promise<number>;
  /** Ends hung requests, kills every sandbox and waits for the exits, closes the server. */
  stop(): Promise<void>;
}

const nonNegativeInteger = z.number().int().nonnegative();
/** Unknown keys are refused: a misspelt `graceMS` would otherwise silently mean 2000 ms. */
const optionsSchema = z.strictObject({
  port: nonNegativeInteger.max(65_535).optional(),
  host: z.string().min(1).optional(),
  rootDir: z.string().min(1),
  graceMs: nonNegativeInteger.optional(),
  seed: z.number().int().optional(),
  auditLimit: z.number().int().positive().optional(),
  sandboxIgnoresSigterm: z.boolean().optional(),
  mode: z.enum([PROVISIONER_MODE.contract, PROVISIONER_MODE.platform]).optional(),
  token: z.string().min(1).optional(),
});

/** Starts a provisioner; it listens before this resolves. Throws on invalid options. */
export async function startProvisioner(options: ProvisionerOptions): Promise<LocalProvisioner> {
  const parsed = optionsSchema.safeParse(options);
  if (!parsed.success) throw new Error(`invalid provisioner options: ${z.prettifyError(parsed.error)}`);
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
  const deferredListeners = new Set<RequestListener>();
  const active = new Set<ApiRequest>();
  let baseUrl = '';
  const urlOf: SandboxUrlOf = (sandboxId) => `${baseUrl}/sandboxes/${encodeURIComponent(sandboxId)}`;
  const mode = options.mode ?? PROVISIONER_MODE.contract;
  const sandboxModes = new Map<string, ProvisionerMode>();
  const modeOf = (sandboxId: string) => sandboxModes.get(sandboxId) ?? mode;
  const pipeline = createApiPipeline({
    registry,
    faults,
    audit,
    listeners,
    urlOf,
    mode,
    modeOf,
    deferredListeners,
    ...(options.token !== undefined ? { token: options.token } : {}),
  });

  const server = createServer((request, response) => {
    // An aborted upload emits 'error' on the request; unheard, it would crash the provisioner.
    request.on('error', () => {});
    const { path, query } = splitTarget(request.url);
    if (path.startsWith('/_control/')) {
      void serveControl(request, response, path, query);
      return;
    }
    const context: ApiRequest = {
      entry: audit.open(request.method ?? '', path),
      request,
      abort: new AbortController(),
      hanging: false,
    };
    active.add(context);
    trackOutcome(context, response);
    void pipeline.serve(context, response, query);
  });

  async function serveControl(
    request: IncomingMessage,
    response: ServerResponse,
    path: string,
    query: URLSearchParams,
  ): Promise<void> {
    try {
      await handleControl(parseRoute(request.method ?? '', path, query), request, response, query, {
        faults,
        audit,
        registry,
      });
    } catch (error) {
      sendError(response, error);
    }
  }

  function trackOutcome(context: ApiRequest, response: ServerResponse): void {
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

  let stopped: Promise<void> | undefined;
  async function stop(): Promise<void> {
    const closed = new Promise<void>((done) => server.close(() => done()));
    for (const context of active) {
      if (context.hanging) audit.finish(context.entry, AUDIT_OUTCOME.hung);
      context.abort.abort();
      context.request.socket.destroy();
    }
    server.closeAllConnections();
    pipeline.cancelDeferred();
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
    mode,
    setSandboxMode(sandboxId, sandboxMode) {
      if (sandboxMode === undefined) sandboxModes.delete(sandboxId);
      else sandboxModes.set(sandboxId, sandboxMode);
    },
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
    onDeferredDelete(listener) {
      deferredListeners.add(listener);
      return () => deferredListeners.delete(listener);
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
