import type { Context } from 'aws-lambda';
import type { CleanupConfig } from './config.ts';
import type { FunctionKey } from './connection-budget.ts';
import type { Database } from './database.ts';
import type { Telemetry } from './observability.ts';
import type { Queues } from './queues.ts';
import type { SecretSource } from './ssm-secure-string.ts';

/**
 * What a function's composition root builds its dependencies from. Each function has one root
 * (`compose…` beside its handler) that asks for exactly what it uses and nothing else; the
 * deployed entry points give it `deployedInfrastructure()` (from the Lambda environment), the
 * local stack and the tests give it theirs. So the deployed wiring is the wiring that runs
 * locally, and a function that never calls the provisioner never needs its URL.
 */
export interface Infrastructure {
  readonly config: CleanupConfig;
  telemetry(functionKey: FunctionKey): Telemetry;
  /** The function's database pool (deployed: its own, sized by infra/queues.json). */
  database(functionKey: FunctionKey, telemetry: Telemetry): Promise<Database>;
  queues(): Queues;
  /**
   * Where the provisioner's bearer token comes from (adapters/provisioner-token.ts), or undefined
   * when none is configured; only the functions that call the provisioner ask.
   */
  provisionerToken(): SecretSource | undefined;
  /** See ConsumerDependencies.maxReceiveCounts: the local stack's shortened queues. */
  readonly maxReceiveCounts?: Partial<Record<string, number>>;
}

/** What a root returns: the handler, the telemetry it reports with, and what to close after it. */
export interface ComposedFunction<E, R> {
  handler: (event: E, context: Context) => Promise<R>;
  telemetry: Telemetry;
  /** Releases what the root itself created (the release function's HTTP client); idempotent. */
  close(): Promise<void>;
}

/** The `function` dimension and log key of each function (alarms and dashboards name them). */
export const FUNCTION_LOG_NAMES: Record<FunctionKey, string> = {
  fenceCheck: 'fence-check',
  release: 'release',
  finalize: 'finalize',
  sweeper: 'sweeper',
  reclaimer: 'reclaimer',
};
