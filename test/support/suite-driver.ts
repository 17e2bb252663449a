import { loadConfig } from '../../functions/adapters/config.ts';
import { DatabaseDriver } from '../../functions/adapters/database-driver.ts';

/**
 * The driver the integration, e2e and chaos tiers run over: DATABASE_DRIVER as the commands read
 * it (a bad value stops the run with the commands' own one-line error), else `neon`.
 *
 * `neon` by default, not the `tcp` a loopback URL gets from the commands: it is the path with more
 * parts that can fail (Neon's driver, the WebSocket bridge, their framing), the one the chaos suite
 * and the benchmarks were measured on, and what the deployments this project started from use.
 * `npm run test:tcp` runs the same tiers over `tcp`; the tests of what differs between the drivers
 * (database-*.test.ts, phase-round-trips, pooler, database-tcp) run over both in every run.
 *
 * vitest.config.ts sets the result as DATABASE_DRIVER in those tiers' workers, so every command a
 * test starts (stack, migrate, ops, demo) inherits it with process.env.
 */
export const SUITE_DEFAULT_DRIVER = DatabaseDriver.NEON;

export function suiteDriver(env: Readonly<Record<string, string | undefined>> = process.env): DatabaseDriver {
  return loadConfig({ DATABASE_DRIVER: env.DATABASE_DRIVER }).databaseDriver ?? SUITE_DEFAULT_DRIVER;
}
