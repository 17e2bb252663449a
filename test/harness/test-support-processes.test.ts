/**
 * The two things that keep the packaging tests from breaking each other (F20): the lock between
 * processes that serialises `npm run package`, and the process-group kill that leaves no orphan
 * behind a hung run.
 */
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runChild } from '../support/child-process.ts';
import { withFileLock } from '../support/file-lock.ts';

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-lock-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Running, as /proc sees it: a killed process whose parent has not reaped it yet is a zombie (Z). */
function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

describe('withFileLock', () => {
  it('lets one holder in at a time', async () => {
    const lock = join(dir, 'lock');
    let inside = 0;
    let most = 0;
    const order: number[] = [];
    await Promise.all(
      [1, 2, 3, 4].map((n) =>
        withFileLock(
          lock,
          async () => {
            inside += 1;
            most = Math.max(most, inside);
            await sleep(30);
            order.push(n);
            inside -= 1;
          },
          { waitMs: 10_000 },
        ),
      ),
    );
    expect(most).toBe(1);
    expect(order.sort()).toEqual([1, 2, 3, 4]);
  });

  it('releases the lock when the work throws', async () => {
    const lock = join(dir, 'lock');
    await expect(
      withFileLock(lock, () => Promise.reject(new Error('boom')), { waitMs: 1_000 }),
    ).rejects.toThrow('boom');
    await expect(withFileLock(lock, async () => 'next', { waitMs: 1_000 })).resolves.toBe('next');
  });

  it('takes over a lock whose holder died', async () => {
    const lock = join(dir, 'lock');
    const dead = await runChild('sh', ['-c', 'echo $$'], { cwd: dir, env: process.env });
    await mkdir(lock);
    await writeFile(join(lock, 'pid'), dead.stdout.trim());
    await expect(withFileLock(lock, async () => 'taken over', { waitMs: 5_000 })).resolves.toBe('taken over');
  });

  it('waits for a live holder and says who holds it when it gives up', async () => {
    const lock = join(dir, 'lock');
    await mkdir(lock);
    await writeFile(join(lock, 'pid'), String(process.pid));
    await expect(withFileLock(lock, async () => 'never', { waitMs: 300 })).rejects.toThrow(
      `held (pid ${process.pid})`,
    );
  });
});

describe('runChild with processGroup', () => {
  it('kills what the child started, not only the child, when it hangs', async () => {
    // sh starts a sleeper of its own and waits: npm → sh → osls in miniature.
    const script = 'sleep 300 & echo $! > grandchild.pid; wait';
    const run = await runChild('sh', ['-c', script], {
      cwd: dir,
      env: process.env,
      timeoutMs: 300,
      processGroup: true,
    });
    expect(run.code).toBeNull();
    const grandchild = Number((await readFile(join(dir, 'grandchild.pid'), 'utf8')).trim());
    // SIGKILL is delivered at once; the kernel needs a moment to take it down.
    for (let i = 0; i < 50 && isAlive(grandchild); i += 1) await sleep(20);
    expect(isAlive(grandchild)).toBe(false);
  });
});
