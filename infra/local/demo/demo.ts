/**
 * `npm start`: the local stack on embedded defaults plus the demo workload, with progress, a
 * summary, a log of every line and an SVG timeline. Returns the summary; the caller exits with
 * `summary.exitCode`. Aborting `signal` (Ctrl-C) stops the workload and tears everything down in
 * order — workload, functions, sandboxes, database — before it returns.
 */
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { type CleanupConfig, loadConfig, redactUrl } from '../../../functions/adapters/config.ts';
import { type Database, openDatabase } from '../../../functions/adapters/database.ts';
import { MetricName } from '../../../functions/adapters/metric-names.ts';
import { redactSecrets } from '../../../functions/adapters/redact.ts';
import { closeLocalBridge, localConnection } from '../database.ts';
import { PlatformSimulator } from '../platform.ts';
import { seededRandom } from '../provisioner/faults.ts';
import { isProcessAlive } from '../provisioner/server.ts';
import { type Stack, startStack } from '../stack.ts';
import { describeStartFailure } from '../start-failure.ts';
import { OutputCapture } from './capture.ts';
import { type DemoDatabase, startDemoDatabase } from './database.ts';
import { createDisplay, type ProgressDisplay } from './display.ts';
import { FunctionMessage, type ParsedLine, PlatformMessage, parseLine } from './lines.ts';
import { DemoModel } from './model.ts';
import type { DemoOptions } from './options.ts';
import { platformLog } from './platform-log.ts';
import { renderSummary } from './report.ts';
import { demoEnvironment, type EffectiveSetting, leaseRenewalBoundMs } from './settings.ts';
import { buildSummary, type DemoSummary } from './summary.ts';
import { renderTimeline } from './timeline.ts';
import {
  deadLetterCounts,
  type GroundTruth,
  groundTruth,
  liveSandboxIds,
  pendingFences,
  survivingProcesses,
} from './verify.ts';
import { type LeakedSandbox, Workload } from './workload.ts';

export interface DemoControl {
  /**
   * Aborted on Ctrl-C (any reason that is not an Error: the demo was interrupted) or on an
   * error nobody handled (an Error reason: the demo failed); either way it stops in order.
   */
  signal: AbortSignal;
  /** The environment (defaults to process.env). */
  env?: Readonly<Record<string, string | undefined>>;
}

/** How often the convergence wait looks at the database. */
const CONVERGENCE_POLL_MS = 250;
const PLATFORM_POOL_SIZE = 10;

export async function runDemo(options: DemoOptions, control: DemoControl): Promise<DemoSummary> {
  const startedAt = Date.now();
  const stamp = timestamp(new Date(startedAt));
  const { env, settings } = demoEnvironment(control.env ?? process.env);
  // Validated before anything starts: a bad value is one clear line and exit 2 (ConfigError).
  const config = loadConfig(env);
  const outDir = resolve(options.outDir);
  const dataDir = resolve(options.dataDir);
  await mkdir(outDir, { recursive: true });
  await mkdir(dataDir, { recursive: true });
  const logPath = join(outDir, `demo-${stamp}.log`);
  const timelinePath = join(outDir, `demo-timeline-${stamp}.svg`);
  const capture = new OutputCapture(logPath);
  const human = options.json ? capture.terminal.err : capture.terminal.out;
  const humanStream = options.json ? process.stderr : process.stdout;
  const interactive = humanStream.isTTY === true && process.env.TERM !== 'dumb';
  const say = options.quiet ? () => {} : (text: string) => human(`${text}\n`);
  const uidPrefix = `demo-${startedAt.toString(36)}`;
  const random = seededRandom(options.seed);

  say(
    `runtime-cleanup demo: ${options.runs} runs in ${Math.min(options.scopes, options.runs)} conversations, ${options.workers} workers, ` +
      `faults ${options.faultsText}, seed ${options.seed}`,
  );
  say(settingsLine(settings));
  say(`  log          ${display(logPath)} (every line the functions and the platform print)`);

  const model = new DemoModel({ totalRuns: options.runs });
  let progress: ProgressDisplay | undefined;
  capture.onLine((line) => {
    const parsed = line.json ? parseLine(line.json) : undefined;
    if (!parsed) return;
    model.ingest(parsed);
    // Once stopping, PostgreSQL and the sandboxes go away under the functions: expected, not news.
    const note = control.signal.aborted ? undefined : notable(parsed);
    if (note) progress?.note(note);
  });
  // Powertools' metrics are off where POWERTOOLS_METRICS_DISABLED=true (the test runner sets it);
  // the demo reads its figures from them, so they are on in this process.
  const metricsSetting = process.env.POWERTOOLS_METRICS_DISABLED;
  process.env.POWERTOOLS_METRICS_DISABLED = 'false';
  capture.start();

  const teardown: Array<{ what: string; run: () => Promise<void> }> = [];
  let stack: Stack | undefined;
  let workload: Workload | undefined;
  let truth: GroundTruth | undefined;
  let failure: string | undefined;
  let lastRunFinishedAt: number | undefined;
  let convergedAt: number | undefined;
  let deadLettersBefore = 0;
  let postgres = '';
  let postmasterPid: number | undefined;
  const onAbort = () => workload?.stop();
  control.signal.addEventListener('abort', onAbort, { once: true });

  try {
    const services = await startServices({
      env,
      config,
      options,
      dataDir,
      stamp,
      say,
      teardown,
      signal: control.signal,
    });
    ({ stack, postgres, postmasterPid } = services);
    deadLettersBefore = total(await deadLetterCounts(stack.sqs, stack.createdQueues));
    throwIfAborted(control.signal);

    const provisioner = stack.provisioner;
    const platform = new PlatformSimulator(services.platformDb, stack.queues, stack.provisionerUrl, {
      token: stack.config.provisionerToken,
    });
    workload = new Workload({
      runs: options.runs,
      leaks: demoLeaks(options.runs),
      scopes: options.scopes,
      workers: options.workers,
      uidPrefix,
      random,
      platform,
      log: platformLog,
      ...(provisioner
        ? {
            describeSandbox: (id: string) => {
              const sandbox = provisioner.sandbox(id);
              return sandbox && { pid: sandbox.pid, dir: sandbox.dir };
            },
          }
        : {}),
    });
    say('');
    progress = createDisplay({
      write: human,
      snapshot: () => model.snapshot(),
      interactive,
      columns: humanStream.columns ?? 100,
      silent: options.quiet,
    });
    model.startedAt = Date.now();
    progress.start();
    await workload.run();
    throwIfAborted(control.signal);
    lastRunFinishedAt = Date.now();

    convergedAt = await converge({
      stack,
      leaked: workload.leaked,
      uidPrefix,
      model,
      options,
      lastRunFinishedAt,
      signal: control.signal,
    });
    throwIfAborted(control.signal);
    truth = await groundTruth({
      db: stack.db,
      uidPrefix,
      sandboxes: workload.sandboxes,
      leaked: workload.leaked,
      provisioner: stack.provisioner,
      provisionerUrl: stack.provisionerUrl,
      provisionerToken: stack.config.provisionerToken,
      sqs: stack.sqs,
      createdQueues: stack.createdQueues,
    });
  } catch (error) {
    if (!control.signal.aborted) failure = describeFailure(error);
  } finally {
    if (control.signal.reason instanceof Error) failure ??= describeFailure(control.signal.reason);
    control.signal.removeEventListener('abort', onAbort);
    workload?.stop();
    progress?.stop();
    if (control.signal.aborted) say('\nstopping: workload, functions, sandboxes, database …');
    for (const step of teardown.reverse()) {
      try {
        await step.run();
      } catch (error) {
        failure ??= `could not stop the ${step.what}: ${describeFailure(error)}`;
      }
    }
    await capture.stop();
    restoreEnv('POWERTOOLS_METRICS_DISABLED', metricsSetting);
  }

  const finishedAt = Date.now();
  const timeline = await writeTimeline(model, {
    path: timelinePath,
    origin: startedAt,
    config,
    options,
  });
  const summary = buildSummary({
    model,
    truth,
    stopped: {
      sandboxProcessesLeft: survivingProcesses(workload?.sandboxes ?? []).length,
      sandboxDirectoriesLeft: (workload?.sandboxes ?? []).filter((s) => s.dir && existsSync(s.dir)).length,
      postgresStopped: postmasterPid === undefined ? null : !isProcessAlive(postmasterPid),
    },
    interrupted: control.signal.aborted && !(control.signal.reason instanceof Error),
    failure,
    seed: options.seed,
    faults: options.faultsText,
    plannedRuns: options.runs,
    leaksMade: workload?.leaked.length ?? 0,
    scopes: options.scopes,
    startedAt,
    finishedAt,
    lastRunFinishedAt,
    convergedAt,
    deleteTimeoutMs: config.provisionerDeleteTimeoutSeconds * 1000,
    cleanupTimeoutMs: config.runtimeCleanupTimeoutSeconds * 1000,
    leaseBoundMs: options.leaseBoundMs ?? leaseRenewalBoundMs(config),
    deadLettersBefore,
    files: { log: display(logPath), timeline },
    lines: { total: capture.counts.lines, unparsed: capture.counts.unparsed },
    postgres,
  });
  if (!options.quiet || !options.json) human(renderSummary(summary, { color: interactive }));
  if (options.json) capture.terminal.out(`${JSON.stringify(summary, null, 2)}\n`);
  return summary;
}

interface Services {
  stack: Stack;
  /** The platform's own pool: another system than the functions, with its own connections. */
  platformDb: Database;
  postgres: string;
  postmasterPid: number | undefined;
}

/**
 * Starts what the demo runs on, each part pushed onto `teardown` as soon as it runs, so that a
 * failure or Ctrl-C halfway stops exactly what was started. Teardown runs in reverse: the
 * platform pool, the stack (consumers, sandboxes, emulator), PostgreSQL, then the bridge (started
 * only for DATABASE_DRIVER=neon on a loopback PostgreSQL).
 */
async function startServices(input: {
  env: Record<string, string | undefined>;
  config: CleanupConfig;
  options: DemoOptions;
  dataDir: string;
  stamp: string;
  say: (text: string) => void;
  teardown: Array<{ what: string; run: () => Promise<void> }>;
  signal: AbortSignal;
}): Promise<Services> {
  const { env, config, options, dataDir, say, teardown, signal } = input;
  teardown.push({ what: 'database bridge', run: closeLocalBridge });
  const configured = { driver: config.databaseDriver, wsProxy: config.databaseWsProxy };
  let databaseUrl = config.databaseUrl;
  let postgres = `DATABASE_URL ${redactUrl(databaseUrl ?? '')}`;
  let postmasterPid: number | undefined;
  if (!databaseUrl) {
    say(`  PostgreSQL   starting embedded PostgreSQL in ${display(join(dataDir, 'postgres'))} …`);
    const database: DemoDatabase = await startDemoDatabase({
      dataDir,
      name: `demo_${input.stamp.replace('-', '_')}_${randomBytes(3).toString('hex')}`,
      configured,
    });
    teardown.push({ what: 'PostgreSQL', run: () => database.stop() });
    databaseUrl = database.url;
    postgres = database.description;
    postmasterPid = database.postmasterPid;
  }
  throwIfAborted(signal);
  const connection = await localConnection(databaseUrl, configured);
  const stack = await startStack({
    env,
    databaseUrl,
    ...(connection.wsProxy ? { wsProxy: connection.wsProxy } : {}),
    // A free port, so the demo never collides with a running `npm run stack` on 4566.
    sqsPort: 0,
    dataDir,
    logLevel: 'INFO',
    provisionerSeed: options.seed,
    provisionerGraceMs: 500,
    onError: (error, source) =>
      platformLog(PlatformMessage.STACK_ERROR, { source, error: redactSecrets(error.message) }, 'ERROR'),
  });
  teardown.push({ what: 'stack', run: () => stack.stop() });
  say(describeStack(stack, postgres, config, dataDir));
  if (options.faults) {
    if (stack.provisioner) stack.provisioner.setFaultProfile(options.faults);
    else say('  faults       none injected: SANDBOX_PROVISIONER_URL names an external provisioner');
  }
  const platformDb = await openDatabase({
    url: databaseUrl,
    ...connection,
    maxConnections: PLATFORM_POOL_SIZE,
    lockTimeoutMs: config.databaseLockTimeoutMs,
    statementTimeoutMs: config.databaseStatementTimeoutMs,
    connectTimeoutMs: config.databaseConnectTimeoutMs,
    queryTimeoutMs: config.databaseQueryTimeoutMs,
  });
  teardown.push({ what: 'platform pool', run: () => platformDb.end() });
  return { stack, platformDb, postgres, postmasterPid };
}

/** Writes the SVG timeline when at least one cleanup finished; returns its path as shown. */
async function writeTimeline(
  model: DemoModel,
  input: { path: string; origin: number; config: CleanupConfig; options: DemoOptions },
): Promise<string | null> {
  if (!model.fencedRuns().some((run) => run.clearedAt !== undefined)) return null;
  const { config, options } = input;
  await writeFile(
    input.path,
    renderTimeline([...model.runs.values()], {
      origin: model.runs.values().next().value?.admittedAt ?? input.origin,
      sample: options.timelineSample,
      deleteTimeoutMs: config.provisionerDeleteTimeoutSeconds * 1000,
      cleanupTimeoutMs: config.runtimeCleanupTimeoutSeconds * 1000,
      title: `runtime-cleanup demo, seed ${options.seed}, faults ${options.faultsText}`,
    }),
  );
  return display(input.path);
}

/**
 * Waits until the database shows no pending fence of the demo and the log has a "fence cleared"
 * for every fenced run, or the bound passes. Switches the faults off after
 * `--faults-stop-after` seconds, and says so, so that a harsh mix still ends.
 */
async function converge(input: {
  stack: Stack;
  leaked: readonly LeakedSandbox[];
  uidPrefix: string;
  model: DemoModel;
  options: DemoOptions;
  lastRunFinishedAt: number;
  signal: AbortSignal;
}): Promise<number | undefined> {
  const { stack, leaked, uidPrefix, model, options, lastRunFinishedAt, signal } = input;
  const deadline = lastRunFinishedAt + options.timeoutSeconds * 1000;
  const faultsStopAt =
    options.faultsStopAfterSeconds > 0 ? lastRunFinishedAt + options.faultsStopAfterSeconds * 1000 : Infinity;
  let faultsOn = options.faults !== undefined && stack.provisioner !== undefined;
  while (!signal.aborted) {
    const pending = await pendingFences(stack.db, uidPrefix);
    const logged = model.snapshot().fences;
    // The leaked sandboxes are the reclaimer's: converged once it has deleted every one of them.
    const leaksLive = await liveSandboxIds(
      {
        provisioner: stack.provisioner,
        provisionerUrl: stack.provisionerUrl,
        provisionerToken: stack.config.provisionerToken,
      },
      leaked.map((leak) => leak.sandboxId),
    );
    // A reclaim run emits its metrics when it ends, after its DELETEs: a leak the provisioner no
    // longer has is accounted for once the run that deleted it has reported it (the summary's
    // count is those metrics; stopping in between once reported 1 of 2 reclaimed).
    const reported = model.metricSum(MetricName.SANDBOXES_RECLAIMED);
    const leaksAccounted = leaksLive.length === 0 && reported >= leaked.length;
    if (pending.length === 0 && logged.pending === 0 && leaksAccounted) return Date.now();
    if (faultsOn && Date.now() >= faultsStopAt) {
      stack.provisioner!.setFaultProfile(undefined);
      faultsOn = false;
      platformLog(PlatformMessage.FAULTS_STOPPED, { pendingFences: pending.length });
    }
    if (Date.now() >= deadline) return undefined;
    try {
      await sleep(CONVERGENCE_POLL_MS, undefined, { signal });
    } catch {
      return undefined;
    }
  }
  return undefined;
}

/**
 * How many runs leak a sandbox on purpose (a platform crash between create and record): a few,
 * and never most of the runs.
 */
export function demoLeaks(runs: number): number {
  return Math.min(3, Math.ceil(runs / 4));
}

/** The lines worth a line of their own in the progress output. */
function notable(line: ParsedLine): string | undefined {
  if (line.kind !== 'log') return undefined;
  const f = line.fields;
  switch (line.message) {
    case FunctionMessage.DEAD_LETTERED:
      return `dead letter: ${String(f.runId ?? '(no run id)')} from ${String(f.queue)}, ${String(f.errorCode)}: ${String(f.reason)}`;
    case PlatformMessage.WORKLOAD_FINISHED:
      return `all ${String(f.runs)} runs finished; waiting for the last cleanups`;
    case PlatformMessage.FAULTS_STOPPED:
      return `faults switched off with ${String(f.pendingFences)} fences pending, so the tail can converge`;
    case PlatformMessage.STACK_ERROR:
      return `stack error in ${String(f.source)}: ${String(f.error)}`;
    case PlatformMessage.SANDBOX_LEAKED:
      return `platform crashed between creating sandbox ${String(f.sandboxId)} and recording it: leaked (the reclaimer's to find)`;
    case FunctionMessage.SANDBOX_RECLAIMED:
      return `reclaimer deleted leaked sandbox ${String(f.sandboxId)} (${String(f.leakReason)}, seen leaked since ${String(f.seenLeakedSince)})`;
    case FunctionMessage.SWEEP_FINISHED:
      return typeof f.reannounced === 'number' && f.reannounced > 0
        ? `sweeper re-announced ${f.reannounced} fences pending longer than FENCE_SWEEP_AFTER_SECONDS`
        : undefined;
    default:
      return undefined;
  }
}

function total(counts: Record<string, number>): number {
  return Object.values(counts).reduce((sum, count) => sum + count, 0);
}

/** The effective timeouts as NAME=value, two a line, so that they can be copied into the environment. */
function settingsLine(settings: readonly EffectiveSetting[]): string {
  const cells = settings.map(
    (setting) => `${setting.name}=${setting.value}${setting.source === 'environment' ? ' (env)' : ''}`,
  );
  cells.push('(demo defaults, except those marked env)');
  const width = Math.max(...cells.map((cell) => cell.length)) + 3;
  const lines: string[] = [];
  for (let i = 0; i < cells.length; i += 2) {
    lines.push(`${cells[i]!.padEnd(width)}${cells[i + 1] ?? ''}`.trimEnd());
  }
  return lines
    .map((text, index) => `${index === 0 ? '  settings     ' : '               '}${text}`)
    .join('\n');
}

function describeStack(stack: Stack, postgres: string, config: CleanupConfig, dataDir: string): string {
  return [
    `  PostgreSQL   ${postgres.replace(`${process.cwd()}/`, '')}`,
    `  SQS          ${config.sqsEndpoint ? `AWS_ENDPOINT_URL_SQS ${stack.sqsEndpoint}` : `in-process emulator on ${stack.sqsEndpoint}`}`,
    `  provisioner  ${stack.provisioner ? `built-in on ${stack.provisionerUrl}, sandboxes in ${display(join(dataDir, 'sandboxes'))}` : `SANDBOX_PROVISIONER_URL ${stack.provisionerUrl}`}`,
  ].join('\n');
}

function describeFailure(error: unknown): string {
  return describeStartFailure(error, process.env);
}

function throwIfAborted(signal: AbortSignal): void {
  if (signal.aborted) throw new Error('interrupted');
}

function restoreEnv(name: string, value: string | undefined): void {
  if (value === undefined) delete process.env[name];
  else process.env[name] = value;
}

/** A path relative to the working directory when it is inside it (shorter, and what a user typed). */
function display(path: string): string {
  const shown = relative(process.cwd(), path);
  return shown.startsWith('..') ? path : shown;
}

function timestamp(date: Date): string {
  const pad = (value: number) => String(value).padStart(2, '0');
  return `${date.getFullYear()}${pad(date.getMonth() + 1)}${pad(date.getDate())}-${pad(date.getHours())}${pad(date.getMinutes())}${pad(date.getSeconds())}`;
}
