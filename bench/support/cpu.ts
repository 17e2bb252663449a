/**
 * Where the CPU went during a measurement, to say what bounds it: this process's event loop
 * (utilization and delay), this process's CPU, the database bridge's, the PostgreSQL backends
 * serving the benchmark database, and the whole machine (from /proc; Linux only, zeros elsewhere).
 */
import { readdir, readFile } from 'node:fs/promises';
import { monitorEventLoopDelay, PerformanceObserver, performance } from 'node:perf_hooks';

export interface CpuReport {
  seconds: number;
  /** Fraction of wall time the event loop was busy (1 = saturated). */
  eventLoopUtilization: number;
  /** How late a 5 ms timer fired (its interval excluded): what any callback waited for the loop. */
  eventLoopDelayP99Ms: number;
  eventLoopDelayMaxMs: number;
  /** Garbage-collection pauses of this process (they stop the event loop, lock holders included). */
  gcPauseMs: { total: number; max: number };
  /** CPU seconds per wall second: 1.0 = one core fully used. */
  cores: { benchProcess: number; bridgeProcess: number; postgresBackends: number; machine: number };
  machineCores: number;
  /** The benchmark process's memory (absent in results written before it was measured). */
  memoryMiB?: MemoryReport;
}

const CLOCK_TICKS_PER_SECOND = 100;

async function readText(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch {
    return undefined;
  }
}

/** utime + stime of a process, in seconds. */
async function processCpuSeconds(pid: number): Promise<number> {
  const stat = await readText(`/proc/${pid}/stat`);
  if (!stat) return 0;
  // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SECOND;
}

/** PostgreSQL backends show their database in their title: `postgres: user db 127.0.0.1(port) idle`. */
async function postgresCpuSeconds(databaseName: string): Promise<number> {
  let total = 0;
  const entries = await readdir('/proc').catch(() => [] as string[]);
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    const cmdline = await readText(`/proc/${entry}/cmdline`);
    if (cmdline?.startsWith('postgres:') && cmdline.includes(` ${databaseName} `)) {
      total += await processCpuSeconds(Number(entry));
    }
  }
  return total;
}

async function machineCpu(): Promise<{ busy: number; cores: number }> {
  const stat = (await readText('/proc/stat')) ?? '';
  const lines = stat.split('\n');
  const values = (lines[0] ?? '').trim().split(/\s+/).slice(1).map(Number);
  const idle = (values[3] ?? 0) + (values[4] ?? 0);
  const total = values.slice(0, 8).reduce((sum, value) => sum + value, 0);
  const cores = lines.filter((line) => /^cpu\d+ /.test(line)).length;
  return { busy: (total - idle) / CLOCK_TICKS_PER_SECOND, cores };
}

/**
 * The event loop, GC pauses and CPU of the process it runs in: the part of the report a child
 * process (part 1's contention load) can measure about itself and send back.
 */
export interface ProcessReport {
  seconds: number;
  /** Fraction of wall time the event loop was busy (1 = saturated). */
  eventLoopUtilization: number;
  /** How late a 5 ms timer fired (its interval excluded): what any callback waited for the loop. */
  eventLoopDelayP99Ms: number;
  eventLoopDelayMaxMs: number;
  gcPauseMs: { total: number; max: number };
  /** CPU seconds per wall second of this process. */
  cores: number;
  /** This process's memory, sampled every MEMORY_SAMPLE_MS (absent in results written before it was measured). */
  memoryMiB?: MemoryReport;
}

export interface MemoryReport {
  rssStart: number;
  rssPeak: number;
  /** When the probe stopped (absent in results written before it was measured). */
  rssEnd?: number;
  heapUsedStart: number;
  heapUsedPeak: number;
}

/** Often enough to catch a burst's peak; one memoryUsage() call costs microseconds. */
const MEMORY_SAMPLE_MS = 20;

const mib = (bytes: number) => Math.round((bytes / 2 ** 20) * 10) / 10;

function startMemorySampler(): { stop(): MemoryReport } {
  const first = process.memoryUsage();
  const report: MemoryReport = {
    rssStart: mib(first.rss),
    rssPeak: mib(first.rss),
    heapUsedStart: mib(first.heapUsed),
    heapUsedPeak: mib(first.heapUsed),
  };
  const sample = () => {
    const now = process.memoryUsage();
    report.rssPeak = Math.max(report.rssPeak, mib(now.rss));
    report.heapUsedPeak = Math.max(report.heapUsedPeak, mib(now.heapUsed));
  };
  const timer = setInterval(sample, MEMORY_SAMPLE_MS);
  timer.unref();
  return {
    stop() {
      clearInterval(timer);
      sample();
      report.rssEnd = mib(process.memoryUsage().rss);
      return report;
    },
  };
}

export interface ProcessProbe {
  stop(): ProcessReport;
}

/**
 * `monitorEventLoopDelay` records the whole interval between two ticks of its timer, resolution
 * included: an idle Node 22 process reports p50 5.09 / p99 5.20 ms at resolution 5 (measured
 * here). The resolution is subtracted so the report's delay is the lateness alone.
 */
const DELAY_RESOLUTION_MS = 5;

const lateness = (intervalNs: number) =>
  Math.round(Math.max(0, intervalNs / 1e6 - DELAY_RESOLUTION_MS) * 100) / 100;

export function startProcessProbe(): ProcessProbe {
  const started = performance.now();
  const elu = performance.eventLoopUtilization();
  const delay = monitorEventLoopDelay({ resolution: DELAY_RESOLUTION_MS });
  delay.enable();
  const gc = { total: 0, max: 0 };
  const gcObserver = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      gc.total += entry.duration;
      gc.max = Math.max(gc.max, entry.duration);
    }
  });
  gcObserver.observe({ entryTypes: ['gc'] });
  const cpu = process.cpuUsage();
  const memory = startMemorySampler();
  return {
    stop() {
      const memoryMiB = memory.stop();
      const seconds = (performance.now() - started) / 1000;
      const used = process.cpuUsage(cpu);
      delay.disable();
      gcObserver.disconnect();
      const eventLoop = performance.eventLoopUtilization(elu);
      return {
        seconds: Math.round(seconds * 1000) / 1000,
        eventLoopUtilization: Math.round(eventLoop.utilization * 100) / 100,
        eventLoopDelayP99Ms: lateness(delay.percentile(99)),
        eventLoopDelayMaxMs: lateness(delay.max),
        gcPauseMs: { total: Math.round(gc.total * 100) / 100, max: Math.round(gc.max * 100) / 100 },
        cores: Math.round(((used.user + used.system) / 1e6 / seconds) * 100) / 100,
        memoryMiB,
      };
    },
  };
}

type LoopStats = Pick<
  ProcessReport,
  'seconds' | 'eventLoopUtilization' | 'eventLoopDelayP99Ms' | 'eventLoopDelayMaxMs' | 'gcPauseMs'
>;

/**
 * The event-loop part of several reports as one: utilisation weighted by duration, delay and GC
 * pause the worst, GC total the sum. Returns the weighting for the callers' own fields.
 */
function mergeLoopStats<R extends LoopStats>(
  reports: readonly R[],
): { stats: LoopStats; weighted: (pick: (r: R) => number) => number } {
  const seconds = reports.reduce((sum, r) => sum + r.seconds, 0);
  const weighted = (pick: (r: R) => number) =>
    seconds > 0
      ? Math.round((reports.reduce((sum, r) => sum + pick(r) * r.seconds, 0) / seconds) * 100) / 100
      : 0;
  return {
    weighted,
    stats: {
      seconds: Math.round(seconds * 1000) / 1000,
      eventLoopUtilization: weighted((r) => r.eventLoopUtilization),
      eventLoopDelayP99Ms: Math.max(0, ...reports.map((r) => r.eventLoopDelayP99Ms)),
      eventLoopDelayMaxMs: Math.max(0, ...reports.map((r) => r.eventLoopDelayMaxMs)),
      gcPauseMs: {
        total: Math.round(reports.reduce((sum, r) => sum + r.gcPauseMs.total, 0) * 100) / 100,
        max: Math.max(0, ...reports.map((r) => r.gcPauseMs.max)),
      },
    },
  };
}

/** Several process reports as one, weighted by duration (event-loop delay and GC pause: the worst). */
export function mergeProcessReports(reports: readonly ProcessReport[]): ProcessReport {
  const { stats, weighted } = mergeLoopStats(reports);
  const memoryMiB = mergeMemory(reports);
  return { ...stats, cores: weighted((r) => r.cores), ...(memoryMiB ? { memoryMiB } : {}) };
}

export interface CpuProbe {
  stop(): Promise<CpuReport>;
}

export async function startCpuProbe(options: {
  bridgePid?: number;
  databaseName: string;
}): Promise<CpuProbe> {
  const own = startProcessProbe();
  const bridge = options.bridgePid ? await processCpuSeconds(options.bridgePid) : 0;
  const postgres = await postgresCpuSeconds(options.databaseName);
  const machine = await machineCpu();
  return {
    async stop() {
      const report = own.stop();
      const bridgeNow = options.bridgePid ? await processCpuSeconds(options.bridgePid) : 0;
      const postgresNow = await postgresCpuSeconds(options.databaseName);
      const machineNow = await machineCpu();
      const perSecond = (value: number) => Math.round((value / report.seconds) * 100) / 100;
      return {
        seconds: report.seconds,
        eventLoopUtilization: report.eventLoopUtilization,
        eventLoopDelayP99Ms: report.eventLoopDelayP99Ms,
        eventLoopDelayMaxMs: report.eventLoopDelayMaxMs,
        gcPauseMs: report.gcPauseMs,
        cores: {
          benchProcess: report.cores,
          bridgeProcess: perSecond(bridgeNow - bridge),
          postgresBackends: perSecond(postgresNow - postgres),
          machine: perSecond(machineNow.busy - machine.busy),
        },
        machineCores: machineNow.cores,
        ...(report.memoryMiB ? { memoryMiB: report.memoryMiB } : {}),
      };
    },
  };
}

/** Several reports as one, each weighted by its duration (event-loop delay and GC pause: the worst; GC total: the sum). */
export function mergeCpuReports(reports: readonly CpuReport[]): CpuReport {
  const { stats, weighted } = mergeLoopStats(reports);
  return {
    ...stats,
    cores: {
      benchProcess: weighted((r) => r.cores.benchProcess),
      bridgeProcess: weighted((r) => r.cores.bridgeProcess),
      postgresBackends: weighted((r) => r.cores.postgresBackends),
      machine: weighted((r) => r.cores.machine),
    },
    machineCores: reports[0]?.machineCores ?? 0,
    ...(mergeMemory(reports) ? { memoryMiB: mergeMemory(reports)! } : {}),
  };
}

/** The first report's starting point and the highest peaks. */
function mergeMemory(reports: readonly { memoryMiB?: MemoryReport }[]): MemoryReport | undefined {
  const measured = reports.flatMap((r) => (r.memoryMiB ? [r.memoryMiB] : []));
  if (!measured.length) return undefined;
  return {
    rssStart: measured[0]!.rssStart,
    rssPeak: Math.max(...measured.map((m) => m.rssPeak)),
    ...(measured.at(-1)!.rssEnd !== undefined ? { rssEnd: measured.at(-1)!.rssEnd } : {}),
    heapUsedStart: measured[0]!.heapUsedStart,
    heapUsedPeak: Math.max(...measured.map((m) => m.heapUsedPeak)),
  };
}
