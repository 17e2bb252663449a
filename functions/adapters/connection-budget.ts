import { ConfigError } from './errors.ts';
import { FUNCTION_DEFINITIONS } from './queues.ts';

/**
 * How many database connections the deployment can open at once, from `infra/queues.json`: every
 * function instance has its own pool, so a function's share is its concurrency (the event source
 * mapping's MaximumConcurrency, or the function's reserved concurrency) times its pool size.
 * Without a bound on each, Lambda scales a busy queue to hundreds of instances and the database
 * refuses connections (53300) right when the backlog needs them most.
 *
 * `npm run package` refuses a deployment whose sum exceeds DATABASE_MAX_CONNECTIONS, and
 * `npm run ops -- check-config` prints the table.
 */
export type FunctionKey = keyof typeof FUNCTION_DEFINITIONS;

interface FunctionLimits {
  maximumConcurrency?: number;
  reservedConcurrency?: number;
  databasePoolSize?: number;
}

export interface BudgetLine {
  functionKey: string;
  /** Where the concurrency bound comes from. */
  bound: 'maximumConcurrency' | 'reservedConcurrency';
  concurrency: number;
  poolSize: number;
  connections: number;
}

export interface ConnectionBudget {
  lines: BudgetLine[];
  total: number;
  max: number;
  fits: boolean;
}

/** Lambda accepts MaximumConcurrency between 2 and 1000 on an SQS event source mapping. */
const MAXIMUM_CONCURRENCY_RANGE = { min: 2, max: 1000 } as const;

function limitsOf(functionKey: string, definitions: Record<string, FunctionLimits>): BudgetLine {
  const limits = definitions[functionKey]!;
  const where = `infra/queues.json functions.${functionKey}`;
  const poolSize = limits.databasePoolSize;
  if (!Number.isSafeInteger(poolSize) || poolSize! < 1) {
    throw new ConfigError(`${where}.databasePoolSize`, String(poolSize), 'must be a positive integer');
  }
  if (limits.maximumConcurrency !== undefined) {
    const value = limits.maximumConcurrency;
    if (
      !Number.isSafeInteger(value) ||
      value < MAXIMUM_CONCURRENCY_RANGE.min ||
      value > MAXIMUM_CONCURRENCY_RANGE.max
    ) {
      throw new ConfigError(
        `${where}.maximumConcurrency`,
        String(value),
        `must be an integer from ${MAXIMUM_CONCURRENCY_RANGE.min} to ${MAXIMUM_CONCURRENCY_RANGE.max} (Lambda's range)`,
      );
    }
    return {
      functionKey,
      bound: 'maximumConcurrency',
      concurrency: value,
      poolSize: poolSize!,
      connections: value * poolSize!,
    };
  }
  const reserved = limits.reservedConcurrency;
  if (reserved === undefined) {
    throw new ConfigError(
      where,
      'no maximumConcurrency or reservedConcurrency',
      'needs one: without it the function scales without bound and so do its connections',
    );
  }
  if (!Number.isSafeInteger(reserved) || reserved < 1) {
    throw new ConfigError(`${where}.reservedConcurrency`, String(reserved), 'must be a positive integer');
  }
  return {
    functionKey,
    bound: 'reservedConcurrency',
    concurrency: reserved,
    poolSize: poolSize!,
    connections: reserved * poolSize!,
  };
}

/** The pool size of one function: what its composition root opens. */
export function databasePoolSize(functionKey: FunctionKey): number {
  return limitsOf(functionKey, FUNCTION_DEFINITIONS).poolSize;
}

export function connectionBudget(
  maxConnections: number,
  definitions: Record<string, FunctionLimits> = FUNCTION_DEFINITIONS,
): ConnectionBudget {
  const lines = Object.keys(definitions).map((key) => limitsOf(key, definitions));
  const total = lines.reduce((sum, line) => sum + line.connections, 0);
  return { lines, total, max: maxConnections, fits: total <= maxConnections };
}

/** One line for a budget that does not fit: the sum, each share, and the two ways out. */
export function connectionBudgetError(budget: ConnectionBudget): ConfigError {
  const shares = budget.lines
    .map((line) => `${line.functionKey} ${line.concurrency} x ${line.poolSize}`)
    .join(' + ');
  return new ConfigError(
    'DATABASE_MAX_CONNECTIONS',
    String(budget.max),
    `must be at least what the functions can open together: ${shares} = ${budget.total} (concurrency x databasePoolSize in infra/queues.json); lower those, or raise DATABASE_MAX_CONNECTIONS to what the database allows`,
  );
}

export function assertConnectionBudget(maxConnections: number): ConnectionBudget {
  const budget = connectionBudget(maxConnections);
  if (!budget.fits) throw connectionBudgetError(budget);
  return budget;
}
