/**
 * The demo's defaults for the timeouts and retry delays. The deployed defaults (a 120 s delete
 * timeout, 10 s first retry, a sweep after 10 minutes) would make a demo of hung deletes last
 * many minutes; these keep the same ladder (lock wait + delete timeout < cleanup timeout, base ≤
 * max) at a scale where a hung delete ends after 2 s and its retry follows a second later.
 * A variable set in the environment always wins.
 */
import type { CleanupConfig } from '../../../functions/adapters/config.ts';

export const DEMO_ENV_DEFAULTS = {
  SANDBOX_PROVIDER_RELEASE_LOCK_TIMEOUT_SECONDS: '1',
  SANDBOX_PROVISIONER_DELETE_TIMEOUT_SECONDS: '2',
  SANDBOX_RUNTIME_CLEANUP_TIMEOUT_SECONDS: '4',
  CLEANUP_RETRY_BASE_SECONDS: '1',
  CLEANUP_RETRY_MAX_SECONDS: '4',
  // Long enough that the sweeper does not re-announce fences still being retried, short enough
  // that a dead-lettered fence is picked up again within the demo's convergence bound.
  FENCE_SWEEP_AFTER_SECONDS: '20',
  FENCE_SWEEP_INTERVAL_SECONDS: '5',
  // The leaks the workload makes on purpose are reclaimed within seconds, not an hour: a sandbox
  // must look leaked on listings 3 s apart, listed every 2 s.
  RECLAIM_INTERVAL_SECONDS: '2',
  RECLAIM_GRACE_SECONDS: '3',
  // RECLAIM_MAX_SHARE_PERCENT keeps its deployed default (50): once its runs are cleaned up, the
  // demo's provisioner lists only the sandboxes leaked on purpose, none named by a row, and the
  // brakes alone would refuse them; the healthy listings of the busy minutes before vouch for the
  // pairing, as they do for a deployed fleet at night.
} as const;

export type DemoSettingName = keyof typeof DEMO_ENV_DEFAULTS;

export interface EffectiveSetting {
  name: DemoSettingName;
  value: string;
  source: 'demo default' | 'environment';
}

type Env = Readonly<Record<string, string | undefined>>;

/** The environment the stack is started with: the user's, with the demo's defaults filled in. */
export function demoEnvironment(env: Env): {
  env: Record<string, string | undefined>;
  settings: EffectiveSetting[];
} {
  const merged: Record<string, string | undefined> = { ...env };
  const settings: EffectiveSetting[] = [];
  for (const [name, value] of Object.entries(DEMO_ENV_DEFAULTS) as Array<[DemoSettingName, string]>) {
    const own = env[name];
    if (own !== undefined && own.trim() !== '') {
      settings.push({ name, value: own, source: 'environment' });
    } else {
      merged[name] = value;
      settings.push({ name, value, source: 'demo default' });
    }
  }
  return { env: merged, settings };
}

/**
 * The longest a lease renewal may wait for the demo to pass: half the provisioner's delete
 * timeout. A renewal that waited behind a hung delete would wait at least that timeout (the
 * failure mode of the original design), so anything below half of it cannot have.
 */
export function leaseRenewalBoundMs(config: CleanupConfig): number {
  return (config.provisionerDeleteTimeoutSeconds * 1000) / 2;
}
