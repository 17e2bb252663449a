import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A real HTTP server whose answers a test scripts, route by route: the DELETE of a sandbox and the
 * listing (`GET …/api/sandboxes`), under an optional path prefix (anything else is a JSON 404, as a
 * web framework answers a route it does not have). It records every request it receives, with the
 * bearer token it carried, so a test can count listings and check what each request sent.
 */
export interface ScriptedRequest {
  method: string;
  path: string;
  /** The token of an `Authorization: Bearer …` header, if any. */
  bearer: string | undefined;
}

export type Answer = (request: IncomingMessage, response: ServerResponse) => void;

export interface ScriptedProvisioner {
  /** The base URL: origin plus prefix. */
  readonly url: string;
  readonly origin: string;
  readonly requests: ScriptedRequest[];
  onDelete(answer: Answer): void;
  onList(answer: Answer): void;
  close(): Promise<void>;
}

export const JSON_TYPE = { 'content-type': 'application/json' } as const;

export function json(status: number, body: unknown, headers: Record<string, string> = {}): Answer {
  return (_request, response) => {
    response.writeHead(status, { ...JSON_TYPE, ...headers }).end(JSON.stringify(body));
  };
}

/** The provisioner's own listing, empty. */
export const EMPTY_LISTING = json(200, { sandboxes: [], count: 0 });

/** FastAPI's answer to a route it does not serve. */
export const FRAMEWORK_NOT_FOUND = json(404, { detail: 'Not Found' });

export async function startScriptedProvisioner(
  options: {
    prefix?: string;
    deleteAnswer?: Answer;
    listAnswer?: Answer;
    /** When given, the API answers 401 to a request whose bearer token is not this one (now). */
    acceptedToken?: () => string;
  } = {},
): Promise<ScriptedProvisioner> {
  const prefix = (options.prefix ?? '').replace(/\/+$/, '');
  let deleteAnswer = options.deleteAnswer ?? json(404, { error: 'no such sandbox' });
  let listAnswer = options.listAnswer ?? EMPTY_LISTING;
  const requests: ScriptedRequest[] = [];
  const server: Server = createServer((request, response) => {
    const path = (request.url ?? '').split('?')[0]!;
    const bearer = /^Bearer (\S+)$/.exec(request.headers.authorization ?? '')?.[1];
    requests.push({ method: request.method ?? '', path, bearer });
    const api = path === `${prefix}/api/sandboxes` || path.startsWith(`${prefix}/api/sandboxes/`);
    if (api && options.acceptedToken && bearer !== options.acceptedToken()) {
      response
        .writeHead(401, { ...JSON_TYPE, 'www-authenticate': 'Bearer' })
        .end('{"detail":"Not authenticated"}');
      return;
    }
    if (request.method === 'GET' && path === `${prefix}/api/sandboxes`) return listAnswer(request, response);
    if (request.method === 'DELETE' && path.startsWith(`${prefix}/api/sandboxes/`)) {
      return deleteAnswer(request, response);
    }
    FRAMEWORK_NOT_FOUND(request, response);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url: `${origin}${prefix}`,
    origin,
    requests,
    onDelete: (answer) => {
      deleteAnswer = answer;
    },
    onList: (answer) => {
      listAnswer = answer;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
