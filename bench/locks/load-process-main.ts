/**
 * The contention-load process of part 1 (started by `load-process.ts`; see there for why it is a
 * process of its own). It plays the platform's lease reconciler and recovery workers: one pool
 * for each, as they are separate processes in production, both through the benchmark's database
 * bridge. It exits when its parent disconnects, so a killed benchmark leaves nothing behind.
 */
import type { Database } from '../../functions/adapters/database.ts';
import { seededRandom } from '../../infra/local/provisioner/faults.ts';
import { type ProcessProbe, startProcessProbe } from '../support/cpu.ts';
import { openBenchPool, warmPool } from '../support/pools.ts';
import {
  type LoadTarget,
  type RunningLoad,
  recoveryTransaction,
  renewLease,
  startLoad,
} from './contention-load.ts';
import type { LoadCommand, LoadProcessOptions, LoadReply } from './load-process.ts';

interface Loads {
  lease: RunningLoad;
  recovery: RunningLoad;
  probe: ProcessProbe;
}

let options: LoadProcessOptions | undefined;
let pools: { lease: Database; recovery: Database } | undefined;
let random: (() => number) | undefined;
let running: Loads | undefined;

function reply(message: LoadReply, then?: () => void): void {
  process.send?.(message, undefined, undefined, () => then?.());
}

async function open(given: LoadProcessOptions): Promise<void> {
  options = given;
  const pool = (maxConnections: number) =>
    openBenchPool({ url: given.url, wsProxy: given.wsProxy, maxConnections });
  pools = { lease: await pool(given.leaseWorkers), recovery: await pool(given.recoveryWorkers) };
  // One generator for the scenario, as before the load moved here: the same seed picks the same
  // sequence of targets across rounds.
  random = seededRandom(given.seed);
  await warmAll();
  await warmUpOperations(given);
}

/**
 * Runs each operation a few hundred times on a target no round uses (no such run; an advisory
 * key of its own), so the driver's and the load's code is optimised before the first round, as it
 * was when the load shared the benchmark's long-running process. A fresh process measured cold
 * would add its JIT compilation to the first round's latencies.
 */
const WARM_UP_OPERATIONS = 200;
const WARM_UP_TARGET: LoadTarget = {
  runId: 'load-process-warm-up',
  uid: 'load-process-warm-up',
  runtimeScopeId: 'load-process-warm-up',
};

async function warmUpOperations(given: LoadProcessOptions): Promise<void> {
  if (!pools) throw new Error('load process not opened');
  const repeat = async (workers: number, operation: (target: LoadTarget) => Promise<void>) => {
    let left = WARM_UP_OPERATIONS;
    await Promise.all(
      Array.from({ length: workers }, async () => {
        while (left-- > 0) await operation(WARM_UP_TARGET);
      }),
    );
  };
  await repeat(given.leaseWorkers, renewLease(pools.lease));
  await repeat(given.recoveryWorkers, recoveryTransaction(pools.recovery));
}

/**
 * Every connection open before a round: a connection set up mid-round would add a WebSocket
 * upgrade and SCRAM authentication to the operation that waited for it. Also re-run before each
 * round because the pool closes connections idle for 10 s.
 */
async function warmAll(): Promise<void> {
  if (!options || !pools) throw new Error('load process not opened');
  await Promise.all([
    warmPool(pools.lease, options.leaseWorkers),
    warmPool(pools.recovery, options.recoveryWorkers),
  ]);
}

async function start(targets: LoadTarget[]): Promise<void> {
  if (!options || !pools || !random) throw new Error('load process not opened');
  if (running) throw new Error('load already running');
  await warmAll();
  const probe = startProcessProbe();
  running = {
    probe,
    lease: startLoad({
      workers: options.leaseWorkers,
      periodMs: options.leasePeriodMs,
      random,
      targets: () => targets,
      operation: renewLease(pools.lease),
    }),
    recovery: startLoad({
      workers: options.recoveryWorkers,
      periodMs: options.recoveryPeriodMs,
      random,
      targets: () => targets,
      operation: recoveryTransaction(pools.recovery),
    }),
  };
}

async function stop(): Promise<LoadReply> {
  if (!running) throw new Error('load not running');
  const { lease, recovery, probe } = running;
  running = undefined;
  const [leaseResult, recoveryResult] = await Promise.all([lease.stop(), recovery.stop()]);
  return { type: 'stopped', report: { lease: leaseResult, recovery: recoveryResult, process: probe.stop() } };
}

async function close(): Promise<void> {
  if (running) await Promise.all([running.lease.stop(), running.recovery.stop()]);
  running = undefined;
  if (pools) await Promise.all([pools.lease.end(), pools.recovery.end()]);
  pools = undefined;
}

async function handle(command: LoadCommand): Promise<LoadReply> {
  switch (command.type) {
    case 'open':
      await open(command.options);
      return { type: 'opened' };
    case 'start':
      await start(command.targets);
      return { type: 'started' };
    case 'stop':
      return stop();
    case 'close':
      await close();
      return { type: 'closed' };
  }
}

process.on('message', (command: LoadCommand) => {
  handle(command).then(
    // After 'closed' is delivered, not before: disconnecting ends the process.
    (message) => reply(message, command.type === 'close' ? () => process.disconnect() : undefined),
    (error: unknown) =>
      reply({
        type: 'failed',
        error: error instanceof Error ? `${error.name}: ${error.message}` : String(error),
      }),
  );
});
// The parent is gone (or told us to close): nothing more will come.
process.on('disconnect', () => {
  void close().finally(() => process.exit(0));
});
