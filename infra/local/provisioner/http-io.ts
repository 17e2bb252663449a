import { once } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { BadRequestError, BodyTooLargeError, ProvisionerError } from './errors.ts';

/** Request bodies are a few ids; anything larger is a client bug, not a workload. */
export const REQUEST_BODY_LIMIT_BYTES = 64 * 1024;

/** Chunk size for streaming an oversized body, so n bytes never sit in memory at once. */
const OVERSIZED_CHUNK_BYTES = 64 * 1024;

/** How many pieces a slow body is dripped in; enough to be slow, few enough to stay cheap. */
const SLOW_BODY_PIECES = 10;

/** Waits `ms`; resolves false instead if `signal` aborts first. */
export async function pause(ms: number, signal: AbortSignal): Promise<boolean> {
  try {
    await sleep(ms, undefined, { signal });
    return true;
  } catch {
    return false;
  }
}

/** Reads a JSON body of at most `REQUEST_BODY_LIMIT_BYTES`. */
export async function readJsonBody(request: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > REQUEST_BODY_LIMIT_BYTES) throw new BodyTooLargeError(REQUEST_BODY_LIMIT_BYTES);
    chunks.push(chunk);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new BadRequestError('request body is not valid JSON');
  }
}

export function sendJson(
  response: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = JSON.stringify(body);
  response.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...headers,
  });
  response.end(text);
}

/** Answers an error as `{"error": message}`, with the status a `ProvisionerError` carries, else 500. */
export function sendError(response: ServerResponse, error: unknown): void {
  if (response.headersSent || response.destroyed) return;
  const status = error instanceof ProvisionerError ? error.httpStatus : 500;
  const message = error instanceof Error ? error.message : String(error);
  sendJson(response, status, { error: message });
}

/**
 * Sends a raw body (an injected error), typed `contentType` when given, else JSON when it parses
 * as JSON and plain text otherwise.
 */
export function sendText(
  response: ServerResponse,
  status: number,
  text: string,
  options: { contentType?: string | undefined; headers?: Record<string, string> } = {},
): void {
  let contentType = options.contentType ?? 'text/plain; charset=utf-8';
  if (options.contentType === undefined) {
    try {
      JSON.parse(text);
      contentType = 'application/json';
    } catch {}
  }
  response.writeHead(status, {
    'content-type': contentType,
    'content-length': Buffer.byteLength(text),
    ...options.headers,
  });
  response.end(text);
}

/**
 * The answer to a request for a route this server does not have: a 404 in plain text, NOT the
 * JSON 404 of an unknown sandbox. A cleanup configured with a wrong path prefix then hears what a
 * web server at a wrong URL says (a 404 page), and refuses it as unconfirmed instead of reading
 * "no such sandbox": the local stack shows the difference production has to make.
 */
export function sendUnknownRoute(response: ServerResponse, method: string, path: string): void {
  sendText(
    response,
    404,
    `no such route: ${method} ${path.slice(0, 200)} (the sandbox provisioner's API is under /api/sandboxes)\n`,
    { contentType: 'text/plain; charset=utf-8' },
  );
}

/**
 * Sends `body` (a JSON object) padded with a `padding` string to exactly `bytes` bytes (or
 * unpadded if it is already longer), streamed with backpressure. Still valid JSON, so a
 * client that reads it all parses the real answer; one that caps its body size fails.
 */
export async function sendOversizedJson(
  response: ServerResponse,
  status: number,
  body: Record<string, unknown>,
  bytes: number,
  signal: AbortSignal,
): Promise<void> {
  const base = JSON.stringify(body);
  const prefix = `${base.slice(0, -1)}${base === '{}' ? '' : ','}"padding":"`;
  const suffix = '"}';
  const paddingBytes = Math.max(0, bytes - prefix.length - suffix.length);
  response.writeHead(status, {
    'content-type': 'application/json',
    'content-length': prefix.length + paddingBytes + suffix.length,
  });
  response.write(prefix);
  const chunk = 'x'.repeat(Math.min(OVERSIZED_CHUNK_BYTES, paddingBytes));
  for (let left = paddingBytes; left > 0; left -= chunk.length) {
    if (signal.aborted) return;
    const piece = left >= chunk.length ? chunk : chunk.slice(0, left);
    if (!response.write(piece)) await waitForDrain(response, signal);
  }
  if (!signal.aborted) response.end(suffix);
}

/** Writes the headers now, then the JSON body in pieces spread over `durationMs`. */
export async function sendJsonSlowly(
  response: ServerResponse,
  status: number,
  body: unknown,
  durationMs: number,
  signal: AbortSignal,
): Promise<void> {
  const bytes = Buffer.from(JSON.stringify(body), 'utf8');
  response.writeHead(status, { 'content-type': 'application/json', 'content-length': bytes.length });
  response.flushHeaders();
  const pieces = Math.max(1, Math.min(SLOW_BODY_PIECES, bytes.length));
  const pieceBytes = Math.ceil(bytes.length / pieces);
  for (let offset = 0; offset < bytes.length; offset += pieceBytes) {
    if (!(await pause(durationMs / pieces, signal))) return;
    response.write(bytes.subarray(offset, offset + pieceBytes));
  }
  response.end();
}

/** Drops the connection with a TCP RST, as a crashed load balancer would. */
export function resetConnection(request: IncomingMessage): void {
  request.socket.resetAndDestroy();
}

async function waitForDrain(response: ServerResponse, signal: AbortSignal): Promise<void> {
  try {
    await once(response, 'drain', { signal });
  } catch {
    // Aborted: the caller checks the signal.
  }
}
