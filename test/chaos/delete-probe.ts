/**
 * Invariant 3, checked on every DELETE the provisioner receives: while the request is in flight,
 * the lock probe tries the scope's advisory lock and the run's row lock from another connection
 * (see lock-probe.ts). A cleanup transaction still holding either is a violation.
 */
import type { Database } from '../../functions/adapters/database.ts';
import type { LocalProvisioner } from '../../infra/local/provisioner/server.ts';
import { preciseNow } from './clock.ts';
import { Invariant, type Violation } from './invariants.ts';
import { LockProbe, type ProbeVerdict } from './lock-probe.ts';
import type { ScopePool } from './platform-ops.ts';

export interface DeleteProbe {
  /** Verdicts by kind, plus `unmapped_sandbox` and `probe_error`. */
  readonly counts: Map<string, number>;
  readonly violations: Violation[];
  /** DELETEs the probe judged (neither unmapped nor failed). */
  probed(): number;
}

export function installDeleteProbe(input: {
  provisioner: LocalProvisioner;
  scopes: ScopePool;
  probeDb: Database;
  stackApplicationName: string;
  waitMs: number;
  onHarnessError: (message: string) => void;
}): DeleteProbe {
  const probe = new LockProbe(input.probeDb, input.stackApplicationName, input.waitMs);
  const counts = new Map<string, number>();
  const violations: Violation[] = [];
  const bump = (kind: string) => counts.set(kind, (counts.get(kind) ?? 0) + 1);
  input.provisioner.onRequest(async (info) => {
    if (info.method !== 'DELETE') return;
    const scope = info.sandboxId === undefined ? undefined : input.scopes.scopeOfSandbox(info.sandboxId);
    if (!scope) {
      bump('unmapped_sandbox');
      return;
    }
    let verdict: ProbeVerdict;
    try {
      verdict = await probe.probe(scope);
    } catch (error) {
      bump('probe_error');
      input.onHarnessError(`probe: ${(error as Error).message}`);
      return;
    }
    bump(verdict.kind);
    if (verdict.kind === 'violation') {
      violations.push({
        invariant: Invariant.NO_LOCK_HELD_DURING_PROVISIONER_CALL,
        key: `3:${info.sandboxId}#${info.generation}:${preciseNow()}`,
        message: `a cleanup transaction held a lock of scope ${scope.runtimeScopeId} for ${Math.round(verdict.heldForMs)} ms while DELETE ${info.sandboxId}?generation=${info.generation} was in flight`,
        details: { ...verdict, sandboxId: info.sandboxId, generation: info.generation },
      });
    }
  });
  return {
    counts,
    violations,
    probed: () =>
      [...counts.entries()]
        .filter(([kind]) => kind !== 'unmapped_sandbox' && kind !== 'probe_error')
        .reduce((sum, [, n]) => sum + n, 0),
  };
}
