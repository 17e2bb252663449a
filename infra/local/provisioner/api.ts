import { z } from 'zod';
import { BadRequestError } from './errors.ts';
import type { SandboxRegistry } from './sandboxes.ts';
import { PROVISIONER_MODE, type ProvisionerMode, type SandboxInfo } from './types.ts';

/** The body of `POST /api/sandboxes` (contract §3); extra fields are ignored. */
export const createSandboxBodySchema = z.object({
  sandbox_id: z.string().min(1),
  thread_id: z.string().min(1),
  user_id: z.string().min(1),
});
export type CreateSandboxBody = z.infer<typeof createSandboxBodySchema>;

/** The body of a `POST` or `GET` answer (contract §3). */
export interface SandboxBody {
  readonly sandbox_id: string;
  readonly sandbox_url: string;
  readonly status: 'running';
  readonly generation: number;
}

/** What the API answers, before any fault decides how (or whether) it is sent. */
export interface ApiAnswer {
  readonly status: number;
  readonly body: Record<string, unknown>;
  /** Set when this request really deleted a sandbox, whatever the client ends up hearing. */
  readonly deletedGeneration?: number;
}

/** Builds the informational `sandbox_url` of a sandbox id. */
export type SandboxUrlOf = (sandboxId: string) => string;

export function parseCreateSandboxBody(body: unknown): CreateSandboxBody {
  const parsed = createSandboxBodySchema.safeParse(body);
  if (!parsed.success) {
    throw new BadRequestError('body must be {"sandbox_id","thread_id","user_id"}, all non-empty strings');
  }
  return parsed.data;
}

export async function createSandbox(
  registry: SandboxRegistry,
  body: CreateSandboxBody,
  urlOf: SandboxUrlOf,
): Promise<ApiAnswer> {
  const { created, sandbox } = await registry.create(body.sandbox_id);
  return { status: created ? 201 : 200, body: { ...toSandboxBody(sandbox, urlOf) } };
}

export function getSandbox(registry: SandboxRegistry, sandboxId: string, urlOf: SandboxUrlOf): ApiAnswer {
  const sandbox = registry.get(sandboxId);
  if (!sandbox) return { status: 404, body: { error: 'no such sandbox', sandbox_id: sandboxId } };
  return { status: 200, body: { ...toSandboxBody(sandbox, urlOf) } };
}

/**
 * `GET /api/sandboxes` (contract §3): every live sandbox. The platform's provisioner lists no
 * generation, so in that mode none is listed either.
 */
export function listSandboxes(
  registry: SandboxRegistry,
  urlOf: SandboxUrlOf,
  modeOf: (sandboxId: string) => ProvisionerMode,
): ApiAnswer {
  const sandboxes = registry.list().map((sandbox) => {
    const body = {
      sandbox_id: sandbox.id,
      sandbox_url: urlOf(sandbox.id),
      status: sandbox.alive ? 'running' : 'exited',
      // When this container was created: a container created again under the same id differs.
      created_at: new Date(sandbox.createdAt).toISOString(),
    };
    return modeOf(sandbox.id) === PROVISIONER_MODE.platform
      ? body
      : { ...body, generation: sandbox.generation };
  });
  return { status: 200, body: { sandboxes, count: sandboxes.length } };
}

export async function deleteSandbox(
  registry: SandboxRegistry,
  sandboxId: string,
  generation: number | undefined,
  mode: ProvisionerMode,
): Promise<ApiAnswer> {
  if (mode === PROVISIONER_MODE.platform) {
    // As deployed: the generation is not looked at, and "nothing to delete" is a success too.
    const result = await registry.delete(sandboxId, undefined);
    return {
      status: 200,
      body: { ok: true, sandbox_id: sandboxId },
      ...(result.kind === 'deleted' ? { deletedGeneration: result.generation } : {}),
    };
  }
  const result = await registry.delete(sandboxId, generation);
  switch (result.kind) {
    case 'deleted':
      return {
        status: 200,
        body: { deleted: true, generation: result.generation },
        deletedGeneration: result.generation,
      };
    case 'conflict':
      return { status: 409, body: { current_generation: result.currentGeneration } };
    case 'not-found':
      return { status: 404, body: { error: 'no such sandbox', sandbox_id: sandboxId } };
  }
}

function toSandboxBody(sandbox: SandboxInfo, urlOf: SandboxUrlOf): SandboxBody {
  return {
    sandbox_id: sandbox.id,
    sandbox_url: urlOf(sandbox.id),
    status: 'running',
    generation: sandbox.generation,
  };
}
