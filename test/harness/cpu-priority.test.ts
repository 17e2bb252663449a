/**
 * The merged run's CPU priorities (test/support/cpu-priority.ts), each checked in a child Node
 * process: a worker cannot take back a priority it gave up, so this one stays as it is.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { getPriority, tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { compileCacheDir } from '../support/compile-cache.ts';

const CPU_PRIORITY = new URL('../support/cpu-priority.ts', import.meta.url).href;

/** Runs `body` (ESM, `cpu` is cpu-priority.ts) in a fresh Node process and parses what it prints. */
function inChild<T>(body: string): T {
  const script = `import * as cpu from ${JSON.stringify(CPU_PRIORITY)};\n${body}`;
  const output = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
    encoding: 'utf8',
    env: { ...process.env, NODE_OPTIONS: '--disable-warning=ExperimentalWarning' },
  });
  return JSON.parse(output) as T;
}

const linux = existsSync('/proc/self/task');
// One step below the inherited priority must exist: under `nice -n 19` there is none.
const canYieldFurther = getPriority() < 19;

// The child yields one step below whatever it inherited (a merged run's harness worker yields
// already, and a process cannot take back a priority it gave up), so the change is seen either way.
describe('yieldCpu', () => {
  it.runIf(linux && canYieldFurther)(
    'lowers every thread of the process, not only the one that calls it',
    () => {
      const { before, after, target } = inChild<{ before: number[]; after: number[]; target: number }>(`
      import { readdirSync } from 'node:fs';
      import { getPriority } from 'node:os';
      const threads = () => readdirSync('/proc/self/task').map((id) => getPriority(Number(id)));
      const before = threads();
      const target = getPriority() + 1;
      cpu.yieldCpu(target);
      console.log(JSON.stringify({ before, after: threads(), target }));
    `);
      // Node runs several threads (V8's helpers, libuv's): the test sees them all.
      expect(after.length).toBeGreaterThan(1);
      expect(before.every((nice) => nice < target)).toBe(true);
      expect(after).toEqual(after.map(() => target));
    },
  );
});

describe('yieldSessionOf', () => {
  // The kernel's autogroup scheduling: where it is off there is nothing to set.
  const autogroup = linux && existsSync('/proc/self/autogroup');

  it.runIf(autogroup)(
    'gives a child in a session of its own the yielding nice of the process that started it',
    () => {
      const { own, child, target } = inChild<{ own: string; child: string; target: number }>(`
      import { spawn } from 'node:child_process';
      import { readFileSync } from 'node:fs';
      import { getPriority } from 'node:os';
      const target = getPriority() + 1;
      cpu.yieldCpu(target);
      const sleeper = spawn('sleep', ['30'], { detached: true, stdio: 'ignore' });
      await cpu.yieldSessionOf(sleeper.pid, target);
      const read = (pid) => readFileSync('/proc/' + pid + '/autogroup', 'utf8').trim();
      const result = { own: read(process.pid), child: read(sleeper.pid), target };
      process.kill(sleeper.pid, 'SIGKILL');
      console.log(JSON.stringify(result));
    `);
      // "/autogroup-123 nice 10": a session other than this one's, at the yielding nice.
      expect(child).toMatch(new RegExp(`^/autogroup-\\d+ nice ${target}$`));
      expect(child.split(' ')[0]).not.toBe(own.split(' ')[0]);
    },
  );
});

describe('assertFullCpuPriority (the chaos tier’s setup)', () => {
  it.runIf(canYieldFurther)(
    'passes at the priority of the process that started it, and refuses one below it',
    () => {
      const { before, after } = inChild<{ before: string; after: string }>(`
      import { getPriority } from 'node:os';
      const outcome = () => {
        try {
          cpu.assertFullCpuPriority();
          return 'passed';
        } catch (error) {
          return error.message;
        }
      };
      const before = outcome();
      cpu.yieldCpu(getPriority() + 1);
      console.log(JSON.stringify({ before, after: outcome() }));
    `);
      expect(before).toBe('passed');
      expect(after).toMatch(/^the chaos tier's worker runs at nice \d+, below its Vitest run's \d+/);
    },
  );
});

describe('compileCacheDir', () => {
  function cacheWith(entries: number): string {
    const dir = mkdtempSync(join(tmpdir(), 'rc-compile-cache-'));
    mkdirSync(join(dir, 'v22-x64-0'));
    for (let index = 0; index < entries; index += 1) writeFileSync(join(dir, 'v22-x64-0', `${index}`), '');
    return dir;
  }

  it('keeps a cache within its limit', () => {
    const dir = cacheWith(5);
    try {
      expect(compileCacheDir(dir, 5)).toBe(dir);
      expect(readdirSync(join(dir, 'v22-x64-0'))).toHaveLength(5);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('empties a cache past its limit (entries of files no run will compile again pile up)', () => {
    const dir = cacheWith(6);
    try {
      expect(compileCacheDir(dir, 5)).toBe(dir);
      expect(existsSync(dir)).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
