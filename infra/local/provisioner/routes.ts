import { BadRequestError } from './errors.ts';

const SANDBOXES_PATH = '/api/sandboxes';
const SANDBOX_PATH_PREFIX = `${SANDBOXES_PATH}/`;

/** A request, identified by method and path; one case per thing the server can do. */
export type Route =
  | { readonly kind: 'create-sandbox' }
  | { readonly kind: 'list-live-sandboxes' }
  | { readonly kind: 'get-sandbox'; readonly sandboxId: string }
  | { readonly kind: 'delete-sandbox'; readonly sandboxId: string; readonly generation: number | undefined }
  | { readonly kind: 'set-fault' }
  | { readonly kind: 'clear-faults' }
  | { readonly kind: 'set-fault-profile' }
  | { readonly kind: 'clear-fault-profile' }
  | { readonly kind: 'list-audit' }
  | { readonly kind: 'list-sandboxes' }
  | { readonly kind: 'not-found' }
  | { readonly kind: 'method-not-allowed'; readonly allow: readonly string[] };

type RouteTable = Record<string, Route>;

/** Control routes steer the provisioner; they are neither audited nor subject to faults. */
const CONTROL_ROUTES: Record<string, RouteTable> = {
  '/_control/faults': { POST: { kind: 'set-fault' }, DELETE: { kind: 'clear-faults' } },
  '/_control/fault-profile': { POST: { kind: 'set-fault-profile' }, DELETE: { kind: 'clear-fault-profile' } },
  '/_control/audit': { GET: { kind: 'list-audit' } },
  '/_control/sandboxes': { GET: { kind: 'list-sandboxes' } },
};

/** Splits a request target into its path and query. */
export function splitTarget(rawUrl: string | undefined): { path: string; query: URLSearchParams } {
  const target = rawUrl ?? '/';
  const queryStart = target.indexOf('?');
  if (queryStart === -1) return { path: target, query: new URLSearchParams() };
  return { path: target.slice(0, queryStart), query: new URLSearchParams(target.slice(queryStart + 1)) };
}

/**
 * Identifies a request. The sandbox id is the single path segment after `/api/sandboxes/`,
 * percent-decoded, so ids may contain any character (`/` as `%2F`). Throws `BadRequestError`
 * for an undecodable id or a `generation` that is not a non-negative integer.
 */
export function parseRoute(method: string, path: string, query: URLSearchParams): Route {
  if (path === SANDBOXES_PATH) {
    if (method === 'POST') return { kind: 'create-sandbox' };
    if (method === 'GET') return { kind: 'list-live-sandboxes' };
    return { kind: 'method-not-allowed', allow: ['GET', 'POST'] };
  }
  if (path.startsWith(SANDBOX_PATH_PREFIX)) {
    const encodedId = path.slice(SANDBOX_PATH_PREFIX.length);
    if (encodedId === '' || encodedId.includes('/')) return { kind: 'not-found' };
    const sandboxId = decodeSandboxId(encodedId);
    if (method === 'GET') return { kind: 'get-sandbox', sandboxId };
    if (method === 'DELETE') return { kind: 'delete-sandbox', sandboxId, generation: parseGeneration(query) };
    return { kind: 'method-not-allowed', allow: ['GET', 'DELETE'] };
  }
  const control = CONTROL_ROUTES[path];
  if (control) return control[method] ?? { kind: 'method-not-allowed', allow: Object.keys(control) };
  return { kind: 'not-found' };
}

function decodeSandboxId(encodedId: string): string {
  try {
    return decodeURIComponent(encodedId);
  } catch {
    throw new BadRequestError('sandbox id in the path is not valid percent-encoding');
  }
}

/**
 * Absent means "whatever generation is live" (the platform's old client sends none);
 * present, it must be one non-negative integer.
 */
function parseGeneration(query: URLSearchParams): number | undefined {
  const values = query.getAll('generation');
  if (values.length === 0) return undefined;
  const [value] = values;
  const generation = Number(value);
  if (values.length > 1 || value === undefined || !/^\d+$/.test(value) || !Number.isSafeInteger(generation)) {
    throw new BadRequestError('generation must be a non-negative integer');
  }
  return generation;
}
