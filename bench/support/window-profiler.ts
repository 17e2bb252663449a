/**
 * CPU profiles of the measured windows only (`npm run bench -- --cpu-prof`): the V8 profiler of
 * this process is started when a sub-run starts announcing and stopped when its last cleaned event
 * arrived, so set-up (admitting runs, spawning sandbox processes) is not in it. One
 * `.cpuprofile` per window, named after it; `bench/report/profile-summary.ts` summarizes one.
 */

import { mkdir, writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
import { join } from 'node:path';

export interface WindowProfiler {
  /** Profiles `work`, writing `<dir>/<name>.cpuprofile`. */
  around<T>(name: string, work: () => Promise<T>): Promise<T>;
}

export async function startWindowProfiler(dir: string): Promise<WindowProfiler> {
  await mkdir(dir, { recursive: true });
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  // 200 µs: enough resolution for functions that take tens of microseconds per call.
  await session.post('Profiler.setSamplingInterval', { interval: 200 });
  return {
    async around(name, work) {
      await session.post('Profiler.start');
      try {
        return await work();
      } finally {
        const { profile } = await session.post('Profiler.stop');
        await writeFile(join(dir, `${name}.cpuprofile`), JSON.stringify(profile));
      }
    },
  };
}
