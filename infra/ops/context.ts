/**
 * What a command runs against, built from the same configuration as the functions (DATABASE_URL,
 * AWS_ENDPOINT_URL_SQS, QUEUE_NAME_PREFIX, …), so the CLI works on the local stack and on AWS
 * alike; with `--stage` the stage fills in the queue prefix and the database URL's SSM parameter
 * (stage.ts). Connections are opened on first use: `check-config` never connects (nor reads SSM),
 * `dlq` never opens the database.
 */
import { SSMClient } from '@aws-sdk/client-ssm';
import { boundedAwsClientOptions } from '../../functions/adapters/aws-clients.ts';
import {
  type CleanupConfig,
  loadConfig,
  redactUrl,
  refuseParameterWithoutUrl,
} from '../../functions/adapters/config.ts';
import type { Database, Executor } from '../../functions/adapters/database.ts';
import { ssmDatabaseUrl } from '../../functions/adapters/database-url.ts';
import {
  DatabaseAuthenticationError,
  DatabaseLockTimeoutError,
  DatabaseUnavailableError,
} from '../../functions/adapters/errors.ts';
import { createTelemetry, type Telemetry } from '../../functions/adapters/observability.ts';
import { createQueues, type Queues } from '../../functions/adapters/queues.ts';
import { closeLocalBridge, openLocalDatabase } from '../local/database.ts';
import {
  DatabaseLockedError,
  DatabaseLoginRefusedError,
  DatabaseNotFoundError,
  DatabaseReadOnlyError,
  SchemaNotMigratedError,
} from './errors.ts';
import { stageNamed, stageOverrides, withStageDefaults } from './stage.ts';

export type Env = Readonly<Record<string, string | undefined>>;

/** The same default as `npm run migrate`: the machine's own PostgreSQL. */
export const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/postgres';

/**
 * An operator is not under a Lambda deadline: a connect gets at least this long (a Neon compute
 * waking from suspend, a SCRAM handshake on a busy machine) before the CLI answers "unreachable".
 */
const OPERATOR_CONNECT_TIMEOUT_MS = 10_000;
const CLOSE_TIMEOUT_MS = 2_000;

/** SQLSTATEs of a database that answers but was never migrated (undefined table, function, column). */
const SCHEMA_MISSING_SQLSTATES = new Set(['42P01', '42883', '42703']);
/** invalid_catalog_name: the database DATABASE_URL names does not exist on that server. */
const DATABASE_MISSING_SQLSTATE = '3D000';
/** Class 28, invalid authorization specification: a wrong password or user, or pg_hba.conf says no. */
const LOGIN_REFUSED_SQLSTATE_CLASS = '28';
/** read_only_sql_transaction: default_transaction_read_only is on, or the server is a hot standby. */
const READ_ONLY_SQLSTATE = '25006';
/** lock_not_available: SET LOCAL lock_timeout ended the wait for another session's lock. */
const LOCK_NOT_AVAILABLE_SQLSTATE = '55P03';

export interface OpsContext {
  /** The process's environment, as given. */
  readonly env: Env;
  /** What the configuration was read from: `env`, with the stage's defaults under `--stage`. */
  readonly configEnv: Env;
  /** Under `--stage`, each exported variable used instead of the stage's own (stage.ts), for stderr. */
  readonly stageOverrides: readonly string[];
  /** Validated at start: a bad value ends every command with exit code 2 before anything connects. */
  readonly config: CleanupConfig;
  /**
   * For messages: the database URL without its password (with the SSM parameter it came from,
   * once read), the SQS endpoint or "AWS (SDK default)".
   */
  readonly describe: { readonly database: string; readonly sqs: string };
  database(): Promise<Database>;
  queues(): Queues;
  telemetry(): Telemetry;
  close(): Promise<void>;
}

/**
 * SSM in the same region as SQS (createSqsClient's rule: AWS_REGION, else us-east-1), where the
 * stage keeps both; AWS_ENDPOINT_URL_SSM, the SDK's own override, points it at a local endpoint.
 */
function operatorSsmClient(env: Env): SSMClient {
  return new SSMClient({ ...boundedAwsClientOptions(), region: env.AWS_REGION?.trim() || 'us-east-1' });
}

export interface OpsOptions {
  /** `--stage NAME`. */
  stage?: string | undefined;
}

export function createOpsContext(env: Env, options: OpsOptions = {}): OpsContext {
  const stage = options.stage === undefined ? undefined : stageNamed(options.stage);
  const configEnv = stage ? withStageDefaults(env, stage) : env;
  const config = loadConfig(configEnv);
  // Without --stage a lone parameter is refused as before: the operator meant a deployed database.
  if (!stage) refuseParameterWithoutUrl(config);
  // Known at start unless it lives in SSM (--stage), which is read once, when a command first
  // needs the database: check-config and dlq never ask SSM.
  const parameterName = config.databaseUrl ? undefined : config.databaseUrlParameter;
  let databaseUrl = parameterName ? undefined : (config.databaseUrl ?? DEFAULT_DATABASE_URL);
  let ssm: SSMClient | undefined;
  const readDatabaseUrl = async (): Promise<string> => {
    if (databaseUrl !== undefined) return databaseUrl;
    ssm ??= operatorSsmClient(env);
    databaseUrl = await ssmDatabaseUrl({ client: ssm, parameterName: parameterName! }).current();
    return databaseUrl;
  };
  let database: Promise<Database> | undefined;
  let queues: Queues | undefined;
  let telemetry: Telemetry | undefined;

  const openChecked = async (): Promise<Database> => {
    const db = await openLocalDatabase({
      url: await readDatabaseUrl(),
      driver: config.databaseDriver,
      wsProxy: config.databaseWsProxy,
      maxConnections: 4,
      lockTimeoutMs: config.databaseLockTimeoutMs,
      statementTimeoutMs: config.databaseStatementTimeoutMs,
      connectTimeoutMs: Math.max(config.databaseConnectTimeoutMs, OPERATOR_CONNECT_TIMEOUT_MS),
      queryTimeoutMs: config.databaseQueryTimeoutMs,
    });
    const checked = withSchemaCheck(db, config.databaseLockTimeoutMs);
    // Against a host that drops packets an operator gets an answer within the connect and query
    // timeouts (DATABASE_CONNECT_TIMEOUT_MS, DATABASE_QUERY_TIMEOUT_MS), not the kernel's minutes.
    try {
      await checked.query('SELECT 1');
    } catch (error) {
      void db.end().catch(() => {});
      if (error instanceof DatabaseUnavailableError) {
        throw new DatabaseUnavailableError(
          `cannot connect to the database DATABASE_URL names: ${error.message}`,
          error.details,
          {
            cause: error,
          },
        );
      }
      throw error;
    }
    return checked;
  };

  return {
    env,
    configEnv,
    stageOverrides: stage ? stageOverrides(env, stage) : [],
    config,
    describe: {
      get database() {
        if (!parameterName) return redactUrl(databaseUrl!);
        return databaseUrl === undefined
          ? `(in SSM parameter ${parameterName}, not read)`
          : `${redactUrl(databaseUrl)} from SSM parameter ${parameterName}`;
      },
      sqs: config.sqsEndpoint ? redactUrl(config.sqsEndpoint) : 'AWS (SDK default endpoint)',
    },
    database() {
      database ??= openChecked();
      return database;
    },
    queues() {
      queues ??= createQueues({
        prefix: config.queueNamePrefix,
        ...(config.sqsEndpoint ? { endpoint: config.sqsEndpoint } : {}),
      });
      return queues;
    },
    telemetry() {
      telemetry ??= createTelemetry({ functionName: 'ops' });
      return telemetry;
    },
    async close() {
      const closing = Promise.allSettled([
        database?.then((db) => db.end()),
        closeLocalBridge(),
        Promise.resolve(queues?.client.destroy()),
        Promise.resolve(ssm?.destroy()),
      ]);
      // A pool stuck on a dead socket must not keep the operator's terminal hanging.
      await Promise.race([closing, new Promise((resolve) => setTimeout(resolve, CLOSE_TIMEOUT_MS).unref())]);
    },
  };
}

/**
 * Turns "relation … does not exist" into "run npm run migrate against this database", and a
 * server that answers but has no such database, or refuses the login, into exit code 3 (not 5:
 * a wrong DATABASE_URL is the operator's to fix, not a bug to report).
 */
function withSchemaCheck(db: Database, lockTimeoutMs: number): Database {
  const translate = (error: unknown): unknown => {
    if (error instanceof DatabaseLockTimeoutError && error.details.sqlstate === LOCK_NOT_AVAILABLE_SQLSTATE) {
      return new DatabaseLockedError(
        `a table this command needs is locked by another session: no lock within DATABASE_LOCK_TIMEOUT_MS (${lockTimeoutMs} ms) (lock timeout: ${error.message}); try again, or look for the holder in pg_locks`,
        { cause: error },
      );
    }
    if (error instanceof DatabaseAuthenticationError) {
      // Already classified by the adapter (28P01/28000): for an operator it is a wrong URL.
      return new DatabaseLoginRefusedError(
        `the server refused the login (${error.message}); check the user and password in DATABASE_URL`,
        { cause: error },
      );
    }
    const sqlstate = (error as { code?: unknown })?.code;
    if (typeof sqlstate !== 'string') return error;
    const message = (error as Error).message;
    if (SCHEMA_MISSING_SQLSTATES.has(sqlstate)) {
      return new SchemaNotMigratedError(
        `the database lacks this project's schema (${message}); run \`npm run migrate\` against it`,
        { cause: error },
      );
    }
    if (sqlstate === DATABASE_MISSING_SQLSTATE) {
      return new DatabaseNotFoundError(`the server has no such database (${message}); check DATABASE_URL`, {
        cause: error,
      });
    }
    if (sqlstate === READ_ONLY_SQLSTATE) {
      return new DatabaseReadOnlyError(
        `the database is read-only (${message}): default_transaction_read_only is on or it is a hot standby; point DATABASE_URL at the primary, read-write endpoint`,
        { cause: error },
      );
    }
    if (sqlstate.startsWith(LOGIN_REFUSED_SQLSTATE_CLASS)) {
      return new DatabaseLoginRefusedError(
        `the server refused the login (${message}); check the user and password in DATABASE_URL`,
        { cause: error },
      );
    }
    return error;
  };
  return {
    stats: db.stats,
    end: () => db.end(),
    // A read runs in a transaction of its own: its SET LOCAL lock_timeout and statement_timeout
    // make a table locked by another session an answer ("locked", exit 4) within
    // DATABASE_LOCK_TIMEOUT_MS, where a bare statement waited for the client's query timeout and
    // was reported as an unreachable database.
    query<Row>(text: string, values?: readonly unknown[]) {
      return db
        .withTransaction((tx) => tx.query<Row>(text, values))
        .catch((error: unknown) => {
          throw translate(error);
        });
    },
    queryOnce<Row>(text: string, values?: readonly unknown[]) {
      return db.queryOnce<Row>(text, values).catch((error: unknown) => {
        throw translate(error);
      });
    },
    withTransaction<T>(work: (tx: Executor) => Promise<T>) {
      return db.withTransaction(work).catch((error: unknown) => {
        throw translate(error);
      });
    },
    transact<Row>(text: string, values?: readonly unknown[]) {
      return db.transact<Row>(text, values).catch((error: unknown) => {
        throw translate(error);
      });
    },
  };
}
