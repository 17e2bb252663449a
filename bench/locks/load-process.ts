/**
 * Part 1's contention load (lease renewals and recovery transactions) in a process of its own,
 * `load-process-main.ts`, driven over IPC.
 *
 * In production the lease reconciler and the recovery workers run in the platform's worker
 * processes, never inside the cleanup function. Run on the benchmark's event loop, between 32
 * concurrent cleanups, their measured latency was mostly that event loop's own delay and GC
 * pauses, not the database's lock waits. Here the load has its own event loop and its own pools
 * (through the same database bridge), so what it measures is what it waits for at the database.
 *
 * One process per scenario (pools opened and warmed once, outside any round); the load itself is
 * started before each round and stopped after it, so no process start-up or connection set-up
 * falls inside a measurement.
 */
import { type ChildProcess, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { ProcessReport } from '../support/cpu.ts';
import type { LoadResult, LoadTarget } from './contention-load.ts';

export interface LoadProcessOptions {
  url: string;
  wsProxy: string;
  leaseWorkers: number;
  leasePeriodMs: number;
  recoveryWorkers: number;
  recoveryPeriodMs: number;
  seed: number;
}

/** What the load process sends back for one round. */
export interface LoadRoundReport {
  lease: LoadResult;
  recovery: LoadResult;
  /** The load process's own event loop while the load ran: shows it was not the bottleneck. */
  process: ProcessReport;
}

export type LoadCommand =
  | { type: 'open'; options: LoadProcessOptions }
  | { type: 'start'; targets: LoadTarget[] }
  | { type: 'stop' }
  | { type: 'close' };

export type LoadReply =
  | { type: 'opened' }
  | { type: 'started' }
  | { type: 'stopped'; report: LoadRoundReport }
  | { type: 'closed' }
  | { type: 'failed'; error: string };

export interface LoadProcess {
  readonly pid: number;
  /** Warms the pools, then starts both loads on `targets`; resolves once they run. */
  start(targets: LoadTarget[]): Promise<void>;
  /** Stops scheduling, awaits the operations in flight, returns the round's samples. */
  stop(): Promise<LoadRoundReport>;
  /** Ends the pools and the process. */
  close(): Promise<void>;
}

const ENTRY = fileURLToPath(new URL('./load-process-main.ts', import.meta.url));
const START_TIMEOUT_MS = 30_000;
const CLOSE_TIMEOUT_MS = 5_000;

export class LoadProcessError extends Error {
  override readonly name = 'LoadProcessError';
  readonly code = 'BENCH_LOAD_PROCESS';
}

export async function startLoadProcess(options: LoadProcessOptions): Promise<LoadProcess> {
  const child: ChildProcess = fork(ENTRY, [], {
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, NODE_OPTIONS: '--disable-warning=ExperimentalWarning' },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  let exited = false;
  const exit = new Promise<void>((resolve) =>
    child.once('exit', () => {
      exited = true;
      resolve();
    }),
  );
  const kill = async () => {
    if (!exited) child.kill('SIGKILL');
    await exit;
  };

  // Commands are strictly sequential: one reply outstanding at a time.
  const request = async <T extends LoadReply['type']>(
    command: LoadCommand,
    expected: T,
    timeoutMs?: number,
  ): Promise<Extract<LoadReply, { type: T }>> => {
    if (exited) throw new LoadProcessError(`load process has exited; cannot ${command.type}`);
    let onMessage: (reply: LoadReply) => void = () => {};
    let onExit: (code: number | null) => void = () => {};
    let timer: NodeJS.Timeout | undefined;
    try {
      return await new Promise<Extract<LoadReply, { type: T }>>((resolve, reject) => {
        onMessage = (reply) => {
          if (reply.type === expected) resolve(reply as Extract<LoadReply, { type: T }>);
          else if (reply.type === 'failed') reject(new LoadProcessError(`${command.type}: ${reply.error}`));
          else reject(new LoadProcessError(`${command.type}: unexpected reply ${reply.type}`));
        };
        onExit = (code) =>
          reject(new LoadProcessError(`load process exited (${code}) during ${command.type}`));
        child.on('message', onMessage);
        child.once('exit', onExit);
        if (timeoutMs !== undefined) {
          timer = setTimeout(
            () => reject(new LoadProcessError(`${command.type} got no reply in ${timeoutMs} ms`)),
            timeoutMs,
          );
        }
        child.send(command);
      });
    } finally {
      clearTimeout(timer);
      child.off('message', onMessage);
      child.off('exit', onExit);
    }
  };

  try {
    await request({ type: 'open', options }, 'opened', START_TIMEOUT_MS);
  } catch (error) {
    await kill();
    throw error;
  }
  return {
    pid: child.pid!,
    async start(targets) {
      await request({ type: 'start', targets }, 'started');
    },
    async stop() {
      return (await request({ type: 'stop' }, 'stopped')).report;
    },
    async close() {
      if (exited) return;
      await request({ type: 'close' }, 'closed', CLOSE_TIMEOUT_MS).catch(() => {});
      // The child exits by itself after 'closed'; a hung one is not left behind.
      const timer = setTimeout(() => void kill(), CLOSE_TIMEOUT_MS);
      await exit;
      clearTimeout(timer);
    },
  };
}
