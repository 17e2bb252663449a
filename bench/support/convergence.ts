/**
 * Setting up cleanups the way the platform does, and checking afterwards that every one of them
 * really converged. A figure is reported only when this check passes.
 */
import type { Executor } from '../../functions/adapters/database.ts';
import type { AdmittedRun, PlatformSimulator, ScopeRef } from '../../infra/local/platform.ts';
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import { deletesByGeneration } from './sandboxes.ts';

/** Admits one root run per scope (with a fresh sandbox generation) and finishes it: fence up. */
export async function admitAndFinish(
  platform: PlatformSimulator,
  scopes: readonly ScopeRef[],
  concurrency = 8,
): Promise<AdmittedRun[]> {
  const runs: AdmittedRun[] = new Array(scopes.length);
  let next = 0;
  const worker = async () => {
    while (next < scopes.length) {
      const index = next++;
      const scope = scopes[index]!;
      const run = await platform.admitRootRun(scope, { workerId: 'bench' });
      if (!run) {
        throw new Error(`scope ${scope.runtimeScopeId} is still fenced: an earlier cleanup did not converge`);
      }
      if (!(await platform.finishRun(run.runId, 'completed', { announce: false }))) {
        throw new Error(`finishing run ${run.runId} raised no fence`);
      }
      runs[index] = run;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return runs;
}

const CHECK_CONVERGED = `
  SELECT r.id, r.runtime_cleanup_pending, s.generation::int AS generation,
         runtime_cleanup_generation_released(s.released_at, s.released_sandbox_id, s.released_generation,
                                             s.sandbox_id, s.generation) AS released
  FROM agent_runs r JOIN sandbox_runtimes s ON s.uid = r.uid AND s.runtime_scope_id = r.runtime_scope_id
  WHERE r.id = ANY ($1::text[])`;

/**
 * Every fence down, every captured generation marked released in the database, no sandbox of
 * these runs live at the provisioner, and the provisioner's audit shows the DELETE that really
 * deleted each generation. Throws naming the first run that did not converge.
 */
export async function assertConverged(
  db: Executor,
  provisioner: LocalProvisioner,
  runs: readonly AdmittedRun[],
): Promise<void> {
  const { rows } = await db.query<{
    id: string;
    runtime_cleanup_pending: boolean;
    generation: number;
    released: boolean;
  }>(CHECK_CONVERGED, [runs.map((run) => run.runId)]);
  const byId = new Map(rows.map((row) => [row.id, row]));
  const deletes = deletesByGeneration(provisioner.audit());
  for (const run of runs) {
    const row = byId.get(run.runId);
    if (!row) throw new Error(`run ${run.runId} vanished`);
    if (row.runtime_cleanup_pending) throw new Error(`run ${run.runId} still has its fence up`);
    if (!row.released || row.generation !== run.generation) {
      throw new Error(`generation ${run.generation} of ${run.sandboxId} is not marked released`);
    }
    if (provisioner.sandbox(run.sandboxId)) throw new Error(`sandbox ${run.sandboxId} is still live`);
    if (!deletes.has(`${run.sandboxId}#${run.generation}`)) {
      throw new Error(`the provisioner never deleted ${run.sandboxId} generation ${run.generation}`);
    }
  }
}

export function describeError(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
