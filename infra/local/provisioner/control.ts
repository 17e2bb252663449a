import type { IncomingMessage, ServerResponse } from 'node:http';
import { z } from 'zod';
import type { AuditLog } from './audit.ts';
import { BadRequestError } from './errors.ts';
import type { Fault, FaultProfile, FaultTable } from './faults.ts';
import { readJsonBody, sendJson } from './http-io.ts';
import type { Route } from './routes.ts';
import type { SandboxRegistry } from './sandboxes.ts';

/** `POST /_control/faults`; the fault itself is validated by `FaultTable.set`. */
const setFaultBodySchema = z.strictObject({ target: z.string().min(1), fault: z.unknown() });

export interface ControlContext {
  readonly faults: FaultTable;
  readonly audit: AuditLog;
  readonly registry: SandboxRegistry;
}

/**
 * Serves the control API, which lets a test or the chaos suite steer a provisioner running
 * in another process: set and clear faults, read the audit log, list live sandboxes.
 */
export async function handleControl(
  route: Route,
  request: IncomingMessage,
  response: ServerResponse,
  query: URLSearchParams,
  context: ControlContext,
): Promise<void> {
  switch (route.kind) {
    case 'set-fault': {
      const parsed = setFaultBodySchema.safeParse(await readJsonBody(request));
      if (!parsed.success) throw new BadRequestError('body must be {"target": string, "fault": {...}}');
      // `FaultTable.set` validates the fault itself, so the cast only defers the check.
      context.faults.set(parsed.data.target, parsed.data.fault as Fault);
      return sendJson(response, 200, { ok: true });
    }
    case 'clear-faults':
      // `?target=<sandbox id>` clears that target's faults only; without it, everything.
      context.faults.clear(query.get('target') ?? undefined);
      return sendJson(response, 200, { ok: true });
    case 'set-fault-profile':
      context.faults.setProfile((await readJsonBody(request)) as FaultProfile);
      return sendJson(response, 200, { ok: true });
    case 'clear-fault-profile':
      context.faults.setProfile(undefined);
      return sendJson(response, 200, { ok: true });
    case 'list-audit':
      return sendJson(response, 200, context.audit.entries());
    case 'list-sandboxes':
      return sendJson(response, 200, context.registry.list());
    case 'method-not-allowed':
      response.setHeader('allow', route.allow.join(', '));
      return sendJson(response, 405, { error: 'method not allowed' });
    default:
      return sendJson(response, 404, { error: 'not found' });
  }
}
