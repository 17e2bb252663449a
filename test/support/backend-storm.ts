import type { Database } from '../../functions/adapters/database.ts';

/**
 * Terminates another process's PostgreSQL backends (those with its `application_name`) in a
 * storm, the way a Neon compute that suspends or restarts ends every connection with SQLSTATE
 * 57P01. Each tick waits a random 0–`maxPauseMs` and then picks its victims by what they are
 * doing, so that every moment of a connection's life gets hit:
 *
 * - `starting`: backends still authenticating, not yet past their first statement, or started
 *   in the last few milliseconds: a FATAL right at connect, possibly in the same frame as
 *   ReadyForQuery;
 * - `idle in transaction`: between BEGIN and COMMIT, the client parked between two statements;
 * - `active`: in the middle of a statement;
 * - `idle`: parked in the pool, or just handed out.
 */
export const StormTarget = {
  STARTING: 'starting',
  IN_TRANSACTION: 'idle in transaction',
  ACTIVE: 'active',
  IDLE: 'idle',
} as const;
export type StormTarget = (typeof StormTarget)[keyof typeof StormTarget];

const TARGETS = Object.values(StormTarget);

const TERMINATE_BY_STATE = `
  SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int AS killed FROM (
    SELECT pid FROM pg_stat_activity
    WHERE application_name = $1::text AND pid <> pg_backend_pid() AND state = $2::text
    ORDER BY random() LIMIT $3::int
  ) victims`;

/**
 * A backend still starting: authenticating (a SCRAM handshake takes the client a while), or
 * connected but not yet sent its first statement, or started in the last few milliseconds.
 */
const TERMINATE_NEWEST = `
  SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int AS killed FROM (
    SELECT pid FROM pg_stat_activity
    WHERE application_name = $1::text AND pid <> pg_backend_pid()
      AND (state IS NULL OR query = '' OR backend_start > clock_timestamp() - interval '20 milliseconds')
    ORDER BY backend_start DESC
    LIMIT $2::int
  ) victims`;

export interface BackendStorm {
  /** Kills so far, by the state the backend was in. */
  readonly kills: Record<StormTarget, number>;
  stop(): Promise<void>;
}

export function startBackendStorm(
  admin: Database,
  applicationName: string,
  options: { maxPauseMs?: number; maxVictims?: number } = {},
): BackendStorm {
  const kills = Object.fromEntries(TARGETS.map((target) => [target, 0])) as Record<StormTarget, number>;
  const maxPauseMs = options.maxPauseMs ?? 15;
  const maxVictims = options.maxVictims ?? 6;
  let running = true;
  let wake: (() => void) | undefined;
  const loop = (async () => {
    while (running) {
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, Math.random() * maxPauseMs);
      });
      if (!running) break;
      const target = TARGETS[Math.floor(Math.random() * TARGETS.length)]!;
      const victims = 1 + Math.floor(Math.random() * maxVictims);
      const { rows } =
        target === StormTarget.STARTING
          ? await admin.query<{ killed: number }>(TERMINATE_NEWEST, [applicationName, victims])
          : await admin.query<{ killed: number }>(TERMINATE_BY_STATE, [applicationName, target, victims]);
      kills[target] += rows[0]?.killed ?? 0;
    }
  })();
  return {
    kills,
    async stop() {
      running = false;
      wake?.();
      await loop;
    },
  };
}
