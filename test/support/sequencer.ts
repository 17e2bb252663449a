/**
 * The order in which a run hands its test files to the workers: the long ones first, then the
 * rest in Vitest's own order.
 *
 * Vitest's order runs one project after another, larger files first (longer ones once its cache
 * holds a previous run, which a clean clone such as CI's never has). In a merged run that started
 * the packaging files (a chain of about 140 s behind one lock) halfway through, so the run ended on
 * one busy worker. Here the files measured as long (file-durations.json, recorded by
 * durations-reporter.ts) are placed first, longest first, by simulating the workers on those
 * durations: a file that waits for a lock another long file holds (the packaging lock) is placed
 * where that lock comes free, with short files filling the gap, rather than parking a worker behind
 * it. Short files keep
 * Vitest's order, one project after another, so that a worker moves on to the next file of its
 * project in the same process (`isolate: false`). The order only changes how long a run takes,
 * never what it runs.
 */
import { readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';
import RECORDED from './file-durations.json' with { type: 'json' };

/**
 * A file at least this long (seconds, as recorded) is scheduled; shorter ones fill in. Each long file
 * placed out of Vitest's order may cost a worker start (a worker moves on to the next file in the
 * same process only if it is of the same project): with 8 s, some 75 files in a merged run, and the
 * run spent about 90 CPU-s more than it saved.
 */
export const LONG_FILE_SECONDS = 20;
/** What a file without a recorded duration is assumed to take (most take one to three seconds). */
const UNRECORDED_FILE_SECONDS = 2;

/**
 * Locks a file holds for much of its run, by the call that takes them: the packaging lock
 * (packaged-template.ts), which the packaging files take once per packaging, and the chaos engine
 * lock (test/chaos/engine-lock.ts). Two of them started at
 * once would leave a worker waiting behind the other's packagings; scheduled as holders of one lock,
 * they run one after another beside the rest.
 */
export const FILE_LONG_LOCKS: Readonly<Record<string, RegExp>> = {
  packaging: /\bpackageService\(/,
  // The chaos engines of a merged run (test/chaos/engine-lock.ts).
  chaosEngine: /\brunCoverageCycleInTurn\(/,
};

export interface ScheduledFile<T> {
  item: T;
  seconds: number;
  lock: string | undefined;
  /**
   * The file's path: a merged run holds one file in up to three database passes, and the copies do
   * the same waits (the demo's runs, the visibility timeouts of failure-paths.test.ts). Started side
   * by side, those waits coincide and leave the CPU idle (a merged run: 15 s at 10–20 % with the
   * three demos and the chaos engine as the only files running); started apart, each waits beside
   * work that computes.
   */
  path?: string;
}

/**
 * Long files by list scheduling on `workers` simulated workers: each worker that comes free takes
 * the longest long file whose lock is free by then and no copy of which (`path`) is still running,
 * else the next short file, else the longest long file whose lock is free, else the longest (which
 * then waits for its lock). Short files not needed as fillers follow in their given order.
 */
export function scheduleLongFirst<T>(
  files: ReadonlyArray<ScheduledFile<T>>,
  workers: number,
  longSeconds: number = LONG_FILE_SECONDS,
): T[] {
  const long = files.filter((file) => file.seconds >= longSeconds).sort((a, b) => b.seconds - a.seconds);
  const short = files.filter((file) => file.seconds < longSeconds);
  const freeAt = Array.from({ length: Math.max(1, workers) }, () => 0);
  const lockFreeAt = new Map<string, number>();
  const copyRunsUntil = new Map<string, number>();
  const order: T[] = [];
  while (long.length > 0) {
    const now = Math.min(...freeAt);
    const worker = freeAt.indexOf(now);
    const lockFree = (file: ScheduledFile<T>) =>
      file.lock === undefined || (lockFreeAt.get(file.lock) ?? 0) <= now;
    const noCopyRunning = (file: ScheduledFile<T>) =>
      file.path === undefined || (copyRunsUntil.get(file.path) ?? 0) <= now;
    const ready = long.findIndex((file) => lockFree(file) && noCopyRunning(file));
    const lockFreeOnly = long.findIndex(lockFree);
    let next: ScheduledFile<T>;
    let start = now;
    if (ready >= 0) next = long.splice(ready, 1)[0]!;
    else if (short.length > 0) next = short.shift()!;
    else if (lockFreeOnly >= 0) next = long.splice(lockFreeOnly, 1)[0]!;
    else {
      next = long.shift()!;
      start = Math.max(now, lockFreeAt.get(next.lock!) ?? 0);
    }
    const end = start + next.seconds;
    if (next.lock !== undefined && next.seconds >= longSeconds) lockFreeAt.set(next.lock, end);
    if (next.path !== undefined)
      copyRunsUntil.set(next.path, Math.max(end, copyRunsUntil.get(next.path) ?? 0));
    freeAt[worker] = end;
    order.push(next.item);
  }
  return [...order, ...short.map((file) => file.item)];
}

export default class LongFilesFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const root = this.ctx.config.root;
    const workers = this.ctx.config.maxWorkers;
    // Groups (sequence.groupOrder) run one after another: each is scheduled on its own.
    const groups = new Map<number, TestSpecification[]>();
    for (const spec of sorted) {
      const order = spec.project.config.sequence.groupOrder;
      if (!groups.has(order)) groups.set(order, []);
      groups.get(order)!.push(spec);
    }
    return [...groups.keys()]
      .sort((a, b) => a - b)
      .flatMap((order) =>
        scheduleLongFirst(
          groups.get(order)!.map((spec) => {
            const path = relative(root, spec.moduleId);
            return { item: spec, seconds: recordedSeconds(path), lock: lockTakenBy(spec.moduleId), path };
          }),
          workers,
        ),
      );
  }
}

function recordedSeconds(path: string): number {
  return (RECORDED.seconds as Record<string, number>)[path] ?? UNRECORDED_FILE_SECONDS;
}

const lockCache = new Map<string, string | undefined>();
function lockTakenBy(file: string): string | undefined {
  if (!lockCache.has(file)) {
    const source = readFileSync(file, 'utf8');
    lockCache.set(file, Object.entries(FILE_LONG_LOCKS).find(([, call]) => call.test(source))?.[0]);
  }
  return lockCache.get(file);
}
