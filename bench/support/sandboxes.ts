import { access } from 'node:fs/promises';
import { join } from 'node:path';
import type { AuditEntry, LocalProvisioner } from '../../infra/local/provisioner/server.ts';

/**
 * Waits until every sandbox process has written its `ready` file (infra/local/provisioner/sandboxes.ts),
 * so no child is still starting when a measurement starts.
 */
export async function waitForSandboxesReady(
  provisioner: LocalProvisioner,
  sandboxIds: readonly string[],
  timeoutMs = 60_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const pending = new Set(sandboxIds);
  while (pending.size > 0) {
    for (const sandboxId of [...pending]) {
      const sandbox = provisioner.sandbox(sandboxId);
      if (!sandbox) throw new Error(`sandbox ${sandboxId} is not live at the provisioner`);
      const ready = await access(join(sandbox.dir, 'ready')).then(
        () => true,
        () => false,
      );
      if (ready) pending.delete(sandboxId);
    }
    if (pending.size === 0) return;
    if (Date.now() > deadline) throw new Error(`${pending.size} sandboxes not ready within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** The DELETE that really deleted each `sandboxId#generation`, from the provisioner's audit. */
export function deletesByGeneration(audit: readonly AuditEntry[]): Map<string, AuditEntry> {
  const deletes = new Map<string, AuditEntry>();
  for (const entry of audit) {
    if (entry.method !== 'DELETE' || entry.sandboxId === undefined || entry.deletedGeneration === undefined) {
      continue;
    }
    deletes.set(`${entry.sandboxId}#${entry.deletedGeneration}`, entry);
  }
  return deletes;
}
