import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { SQSClient } from '@aws-sdk/client-sqs';
import type { CleanupConfig } from '../../functions/adapters/config.ts';
import {
  loadConfig,
  refuseParameterWithoutUrl,
  validProvisionerUrl,
} from '../../functions/adapters/config.ts';
import { openDatabase, type PooledDatabase } from '../../functions/adapters/database.ts';
import type { DatabaseDriver } from '../../functions/adapters/database-driver.ts';
import { FUNCTION_LOG_NAMES, type Infrastructure } from '../../functions/adapters/infrastructure.ts';
import { withObservability } from '../../functions/adapters/lambda.ts';
import { createTelemetry, type Telemetry } from '../../functions/adapters/observability.ts';
import { provisionerTokenSource } from '../../functions/adapters/provisioner-token.ts';
import {
  createQueues,
  createSqsClient,
  FUNCTION_DEFINITIONS,
  QueueName,
  type Queues,
} from '../../functions/adapters/queues.ts';
import { composeFenceCheck } from '../../functions/fence-check/handler.ts';
import { composeFinalize } from '../../functions/finalize/handler.ts';
import { composeReclaimer, type ReclaimerResult } from '../../functions/reclaimer/handler.ts';
import { composeRelease } from '../../functions/release/handler.ts';
import { composeSweeper } from '../../functions/sweeper/handler.ts';
import type { SweepResult } from '../../functions/sweeper/sweep.ts';
import { migrate } from '../migrate.ts';
import { localConnection } from './database.ts';
import { startDatabaseBridge } from './db-bridge.ts';
import { startEmbeddedPostgres } from './embedded-postgres.ts';
import {
  createEventSource,
  type EventSource,
  type EventSourceOptions,
  localLambdaContext,
} from './event-source.ts';
import { type LocalProvisioner, type ProvisionerMode, startProvisioner } from './provisioner/server.ts';
import {
  type CreatedQueue,
  createQueues as createQueuesOnEndpoint,
  type QueueOverrides,
} from './queue-setup.ts';

/**
 * The local stack (`npm run stack`): an SQS emulator with the contract's queues, migrations
 * applied, the real handlers invoked through an emulated event source mapping, the sweeper and the
 * reclaimer on their intervals, and the built-in provisioner unless SANDBOX_PROVISIONER_URL names another. Each
 * function is built by its own composition root, the one its deployed entry point uses; only
 * the infrastructure handed to the roots is local (one shared pool, the emulator's queues).
 *
 * Every part can be replaced by configuration: DATABASE_URL (else embedded-postgres),
 * AWS_ENDPOINT_URL_SQS (else fauxqs in-process), SANDBOX_PROVISIONER_URL.
 */
export interface StackOptions {
  /** Configuration source; defaults to process.env. */
  env?: Readonly<Record<string, string | undefined>>;
  /** Overrides DATABASE_URL. */
  databaseUrl?: string;
  /**
   * A running WebSocket bridge (`host:port`) for the `neon` driver; else DATABASE_WS_PROXY, else
   * one the stack starts for a loopback URL. The `tcp` driver (DATABASE_DRIVER, or a loopback URL's
   * default) needs none and starts none.
   */
  wsProxy?: string;
  /** Port of the in-process SQS emulator: 4566 by contract, 0 in tests. */
  sqsPort?: number;
  /** Where embedded PostgreSQL keeps its data and the provisioner its sandboxes (git-ignored). */
  dataDir?: string;
  queueOverrides?: QueueOverrides;
  /** Concurrent pollers per consumed queue (Lambda's concurrent instances). */
  concurrency?: Partial<Record<'fenceCheck' | 'release' | 'finalize', number>>;
  logLevel?: string;
  /** Seed for the built-in provisioner's fault decisions. */
  provisionerSeed?: number;
  /** Grace between SIGTERM and SIGKILL for built-in sandboxes. */
  provisionerGraceMs?: number;
  /** Requests the built-in provisioner's audit keeps, oldest dropped first (default 10 000). */
  provisionerAuditLimit?: number;
  /** The built-in provisioner behaves like the contract's (default) or like the platform's deployed one. */
  provisionerMode?: ProvisionerMode;
  /** Runs the sweeper on its interval (default true). */
  sweeper?: boolean;
  /** Runs the reclaimer every RECLAIM_INTERVAL_SECONDS (default true). */
  reclaimer?: boolean;
  /**
   * Chaos hook (test/chaos): told of each reclaimer run when it ends, with when it started and
   * ended (`performance.timeOrigin + performance.now()`), so that a check can count runs rather
   * than assume a loaded machine keeps the interval.
   */
  onReclaimerRun?: (run: {
    startedAtMs: number;
    endedAtMs: number;
    /** What the run returned, or what it threw. */
    ended: { result: ReclaimerResult } | { error: unknown };
  }) => void;
  onError?: (error: Error, source: string) => void;
  /**
   * Told the name of each step of stop() as it begins (the SQS emulator, the database pool, …), so
   * that a stop that takes long says where it is (the chaos suite's watchdog prints it).
   */
  onStopStep?: (step: string) => void;
  /**
   * How long one step of stop() may take before the stop goes on without it, reported through
   * `onError` (source `stop`): STOP_STEP_TIMEOUT_MS unless given.
   */
  stopStepTimeoutMs?: number;
  /**
   * Chaos hook (test/chaos): wraps the queue client the functions and the sweeper send with, e.g.
   * to make a send fail at a chosen step boundary (a crash after a delete, before the finalize
   * command is published). Omitted, the client is used as is.
   */
  wrapQueues?: (queues: Queues) => Queues;
  /** Chaos hook (test/chaos): see `EventSourceOptions.beforeAck`; omitted, every processed message is deleted. */
  beforeAck?: EventSourceOptions['beforeAck'];
}

export interface Stack {
  config: CleanupConfig;
  db: PooledDatabase;
  /** The same queue client the functions use (stats count every call). */
  queues: Queues;
  sqs: SQSClient;
  sqsEndpoint: string;
  databaseUrl: string;
  /** The driver the stack's pool uses (DATABASE_DRIVER, else by the URL's host). */
  databaseDriver: DatabaseDriver;
  provisionerUrl: string;
  /** The built-in provisioner, when SANDBOX_PROVISIONER_URL was not given. */
  provisioner: LocalProvisioner | undefined;
  createdQueues: Map<string, CreatedQueue>;
  telemetry: Record<'fenceCheck' | 'release' | 'finalize' | 'sweeper' | 'reclaimer', Telemetry>;
  runSweeper(): Promise<SweepResult>;
  /** One reclaim run now (as the schedule would start it); runs never overlap. */
  runReclaimer(): Promise<ReclaimerResult>;
  stop(): Promise<void>;
}

export const DEFAULT_SQS_PORT = 4566;

/**
 * A step of stop() that has not finished by then is left behind, and the steps after it still run:
 * one stop once waited forever on a step with no timer or socket left that could ever end it (a
 * chaos run's, in "stopping: the stack"), holding the SQS emulator's port and the rest open with it.
 * The event sources' step, which lets running invocations finish, gets their function timeout
 * instead.
 */
export const STOP_STEP_TIMEOUT_MS = 30_000;

/**
 * Pollers per queue. Releases mostly wait on the provisioner, so they get more: a few hung
 * deletes must not starve every other scope's release (deployed, MaximumConcurrency bounds it).
 */
const DEFAULT_CONCURRENCY = { fenceCheck: 4, release: 16, finalize: 4 } as const;

export async function startStack(options: StackOptions = {}): Promise<Stack> {
  const config = loadConfig(options.env ?? process.env);
  // Given only the deployed functions' parameter, the stack would quietly use embedded PostgreSQL.
  if (options.databaseUrl === undefined) refuseParameterWithoutUrl(config);
  // SANDBOX_PROVISIONER_TOKEN as is; its deployed parameter alone is refused (the stack reads no SSM).
  const provisionerToken = provisionerTokenSource(config);
  const dataDir = resolve(options.dataDir ?? '.data');
  const onError = options.onError ?? (() => {});
  /**
   * What stop() undoes, last started first, each under its name, with how long it may take when not
   * STOP_STEP_TIMEOUT_MS.
   */
  const cleanups: Array<{ step: string; run: () => Promise<void>; timeoutMs?: number }> = [];
  /** `report` hears a step's failure or overrun; a start that failed reports only its own error. */
  const stopAll = async (report: (error: Error, source: string) => void = onError) => {
    for (const { step, run, timeoutMs } of cleanups.reverse()) {
      options.onStopStep?.(step);
      await stopStep(step, run, options.stopStepTimeoutMs ?? timeoutMs ?? STOP_STEP_TIMEOUT_MS, report);
    }
    cleanups.length = 0;
  };

  try {
    // The emulator first: it owns a fixed port, so a second stack fails here, before it touches
    // the first one's database folder.
    let sqsEndpoint = config.sqsEndpoint;
    if (!sqsEndpoint) {
      const { startFauxqs } = await import('fauxqs');
      const port = options.sqsPort ?? DEFAULT_SQS_PORT;
      // fauxqs always listens on 0.0.0.0; `host` only names the host in its queue URLs.
      const fauxqs = await startFauxqs({ port, host: '127.0.0.1', logger: false }).catch((error: Error) => {
        throw new Error(
          (error as NodeJS.ErrnoException).code === 'EADDRINUSE'
            ? `port ${port} is already in use (another stack?): stop it, or set AWS_ENDPOINT_URL_SQS to use that SQS endpoint`
            : `the SQS emulator did not start: ${error.message}`,
        );
      });
      cleanups.push({ step: 'SQS emulator', run: () => fauxqs.stop() });
      sqsEndpoint = `http://127.0.0.1:${fauxqs.port}`;
    }
    let databaseUrl = options.databaseUrl ?? config.databaseUrl;
    if (!databaseUrl) {
      const embedded = await startEmbeddedPostgres({
        dataDir: join(dataDir, 'postgres'),
        callerHandlesSignals: true,
      });
      cleanups.push({ step: 'embedded PostgreSQL', run: () => embedded.stop() });
      databaseUrl = embedded.url;
    }
    const connection = await localConnection(
      databaseUrl,
      { driver: config.databaseDriver, wsProxy: options.wsProxy ?? config.databaseWsProxy },
      async () => {
        const bridge = await startDatabaseBridge();
        cleanups.push({ step: 'database bridge', run: () => bridge.close() });
        return bridge.address;
      },
    );
    const db = await openDatabase({
      url: databaseUrl,
      ...connection,
      maxConnections: 20,
      lockTimeoutMs: config.databaseLockTimeoutMs,
      statementTimeoutMs: config.databaseStatementTimeoutMs,
      connectTimeoutMs: config.databaseConnectTimeoutMs,
      queryTimeoutMs: config.databaseQueryTimeoutMs,
      onIdleError: (error) => onError(error, 'database'),
    });
    cleanups.push({ step: 'database pool', run: () => db.end() });
    await migrate(db);

    let provisioner: LocalProvisioner | undefined;
    let provisionerUrl = validProvisionerUrl(config);
    if (!provisionerUrl) {
      const rootDir = join(dataDir, 'sandboxes');
      await mkdir(rootDir, { recursive: true });
      provisioner = await startProvisioner({
        rootDir,
        ...(options.provisionerSeed !== undefined ? { seed: options.provisionerSeed } : {}),
        ...(options.provisionerGraceMs !== undefined ? { graceMs: options.provisionerGraceMs } : {}),
        ...(options.provisionerMode !== undefined ? { mode: options.provisionerMode } : {}),
        ...(options.provisionerAuditLimit !== undefined ? { auditLimit: options.provisionerAuditLimit } : {}),
        // With SANDBOX_PROVISIONER_TOKEN set, the built-in provisioner requires it on every request.
        ...(config.provisionerToken !== undefined ? { token: config.provisionerToken } : {}),
      });
      cleanups.push({ step: 'built-in provisioner', run: () => provisioner!.stop() });
      provisionerUrl = provisioner.url;
    }

    const sqs = createSqsClient({ endpoint: sqsEndpoint });
    cleanups.push({ step: 'SQS client', run: async () => sqs.destroy() });
    const createdQueues = await createQueuesOnEndpoint(sqs, {
      prefix: config.queueNamePrefix,
      ...(options.queueOverrides ? { overrides: options.queueOverrides } : {}),
    });
    const plainQueues = createQueues({ client: sqs, prefix: config.queueNamePrefix });
    const queues = options.wrapQueues ? options.wrapQueues(plainQueues) : plainQueues;

    const logLevel = options.logLevel ?? process.env.LOG_LEVEL ?? 'INFO';
    // As Lambda does for an on-demand instance: Powertools then counts each function's cold start.
    process.env.AWS_LAMBDA_INITIALIZATION_TYPE ??= 'on-demand';
    const telemetry = {
      fenceCheck: createTelemetry({ functionName: FUNCTION_LOG_NAMES.fenceCheck, logLevel }),
      release: createTelemetry({ functionName: FUNCTION_LOG_NAMES.release, logLevel }),
      finalize: createTelemetry({ functionName: FUNCTION_LOG_NAMES.finalize, logLevel }),
      sweeper: createTelemetry({ functionName: FUNCTION_LOG_NAMES.sweeper, logLevel }),
      reclaimer: createTelemetry({ functionName: FUNCTION_LOG_NAMES.reclaimer, logLevel }),
    };
    const maxReceiveCounts = Object.fromEntries(
      [...createdQueues.values()].map((queue) => [queue.name, queue.definition.maxReceiveCount ?? undefined]),
    );
    // The stack plays every instance of every function in one process: one pool for all of them.
    const infrastructure: Infrastructure = {
      config: { ...config, databaseUrl, provisionerUrl },
      telemetry: (functionKey) => telemetry[functionKey],
      database: async () => db,
      queues: () => queues,
      provisionerToken: () => provisionerToken,
      maxReceiveCounts,
    };
    const composed = {
      fenceCheck: await composeFenceCheck(infrastructure),
      release: await composeRelease(infrastructure),
      finalize: await composeFinalize(infrastructure),
    };
    // Registered before the consumers' stop, so it runs after it: no release is using it then.
    cleanups.push({ step: "release's provisioner client", run: () => composed.release.close() });
    const handlers = {
      fenceCheck: withObservability(composed.fenceCheck.handler, composed.fenceCheck.telemetry),
      release: withObservability(composed.release.handler, composed.release.telemetry),
      finalize: withObservability(composed.finalize.handler, composed.finalize.telemetry),
    };
    const sweeperFunction = await composeSweeper(infrastructure);
    const sweeper = withObservability(sweeperFunction.handler, sweeperFunction.telemetry);
    const reclaimerFunction = await composeReclaimer(infrastructure);
    cleanups.push({ step: "reclaimer's provisioner client", run: () => reclaimerFunction.close() });
    const reclaimer = withObservability(reclaimerFunction.handler, reclaimerFunction.telemetry);

    const concurrency = { ...DEFAULT_CONCURRENCY, ...options.concurrency };
    const consumed = [
      { queue: QueueName.RUN_FINISHED, fn: 'fenceCheck', name: 'fence-check' },
      { queue: QueueName.RUNTIME_RELEASE, fn: 'release', name: 'release' },
      { queue: QueueName.RUNTIME_FINALIZE, fn: 'finalize', name: 'finalize' },
    ] as const;
    const sources: EventSource[] = consumed.map(({ queue, fn, name }) => {
      const created = createdQueues.get(queue)!;
      const definition = FUNCTION_DEFINITIONS[fn];
      return createEventSource({
        client: sqs,
        queueUrl: created.url,
        queueArn: created.arn,
        functionName: name,
        handler: handlers[fn],
        batchSize: definition.batchSize,
        timeoutSeconds: definition.timeoutSeconds,
        queueVisibilityTimeoutSeconds: created.definition.visibilityTimeoutSeconds,
        concurrency: concurrency[fn],
        onError: (error) => onError(error, name),
        ...(options.beforeAck ? { beforeAck: options.beforeAck } : {}),
      });
    });
    for (const source of sources) source.start();
    cleanups.push({
      step: 'event sources',
      // A running invocation is let finish, as Lambda lets it: at most its function's timeout.
      timeoutMs: Math.max(...consumed.map(({ fn }) => FUNCTION_DEFINITIONS[fn].timeoutSeconds)) * 1000,
      run: async () => {
        // A source's stop waits for its running invocations, and a release waiting on a hung DELETE
        // would hold it for the whole delete timeout: end the polls, then abort the DELETEs (the
        // fences stay up and the in-flight records keep the scopes closed), then wait.
        const stopped = Promise.all(sources.map((source) => source.stop()));
        await composed.release.close().catch(() => {});
        await stopped;
      },
    });
    await Promise.all(sources.map((source) => source.polling));

    const runSweeper = () =>
      sweeper({}, localLambdaContext('sweeper', FUNCTION_DEFINITIONS.sweeper.timeoutSeconds));
    if (options.sweeper !== false) {
      const timer = setInterval(() => {
        runSweeper().catch((error: Error) => onError(error, 'sweeper'));
      }, config.fenceSweepIntervalSeconds * 1000);
      cleanups.push({ step: 'sweeper schedule', run: async () => clearInterval(timer) });
    }

    // Deployed, reservedConcurrency 1 and a schedule keep runs apart; here a run in progress is
    // joined instead of overlapped.
    let reclaiming: Promise<ReclaimerResult> | undefined;
    const now = () => performance.timeOrigin + performance.now();
    const runReclaimer = () => {
      if (reclaiming) return reclaiming;
      const startedAtMs = now();
      const ended = (outcome: { result: ReclaimerResult } | { error: unknown }) => {
        reclaiming = undefined;
        try {
          options.onReclaimerRun?.({ startedAtMs, endedAtMs: now(), ended: outcome });
        } catch (error) {
          // A watcher's failure never changes what the run returned or threw.
          onError(error as Error, 'onReclaimerRun');
        }
      };
      reclaiming = reclaimer(
        {},
        localLambdaContext('reclaimer', FUNCTION_DEFINITIONS.reclaimer.timeoutSeconds),
      ).then(
        (result) => {
          ended({ result });
          return result;
        },
        (error: unknown) => {
          ended({ error });
          throw error;
        },
      );
      return reclaiming;
    };
    if (options.reclaimer !== false) {
      const timer = setInterval(() => {
        runReclaimer().catch((error: Error) => onError(error, 'reclaimer'));
      }, config.reclaimIntervalSeconds * 1000);
      cleanups.push({
        step: 'reclaim schedule',
        run: async () => {
          clearInterval(timer);
          // As for the releases: a reclaim DELETE that hangs is aborted, not waited for.
          if (reclaiming) await reclaimerFunction.close().catch(() => {});
          await reclaiming?.catch(() => {});
        },
      });
    }

    return {
      config,
      db,
      queues,
      sqs,
      sqsEndpoint,
      databaseUrl,
      databaseDriver: connection.driver,
      provisionerUrl,
      provisioner,
      createdQueues,
      telemetry,
      runSweeper,
      runReclaimer,
      stop: stopAll,
    };
  } catch (error) {
    // The start's own error is the one line a person reads; an undo that fails after it is not news.
    await stopAll(() => {});
    throw error;
  }
}

/**
 * One step of stop(): its failure, or its overrunning `timeoutMs`, is reported (source `stop`) and
 * never keeps the steps after it from running. An overrun step is not waited for again.
 */
async function stopStep(
  step: string,
  run: () => Promise<void>,
  timeoutMs: number,
  onError: (error: Error, source: string) => void,
): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const overdue = new Promise<'overdue'>((resolve) => {
    timer = setTimeout(() => resolve('overdue'), timeoutMs);
  });
  const running = Promise.resolve()
    .then(run)
    .then(
      () => 'done' as const,
      (error: unknown) => {
        onError(error instanceof Error ? error : new Error(String(error)), 'stop');
        return 'failed' as const;
      },
    );
  try {
    if ((await Promise.race([running, overdue])) === 'overdue') {
      onError(
        new Error(`stopping the stack: ${step} did not finish within ${timeoutMs} ms; going on without it`),
        'stop',
      );
    }
  } finally {
    clearTimeout(timer);
  }
}
