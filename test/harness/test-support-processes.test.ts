/**
 * The two things that keep the packaging tests from breaking each other (F20): the lock between
 * processes that serialises `npm run package`, and the process-group kill that leaves no orphan
 * behind a hung run.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runChild } from '../support/child-process.ts';
import { removeFileLock, withFileLock } from '../support/file-lock.ts';
import { isRunning } from '../support/processes.ts';

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'runtime-cleanup-lock-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('withFileLock', () => {
  it('removeFileLock takes away a lock left held and its waiters’ queue, and is quiet when there is none', async () => {
    const lock = join(dir, 'lock');
    await mkdir(lock);
    await mkdir(`${lock}.queue`);
    await writeFile(join(`${lock}.queue`, `000000000000001-000001-${process.pid}-00000000`), '');

    await removeFileLock(lock);
    await removeFileLock(lock);

    expect(await readdir(dir)).toEqual([]);
  });

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

  it('lets waiters in in arrival order: a holder that takes it again queues behind them', async () => {
    // template-stage-settings packages a dozen times in a row; a lock that let it re-take at once
    // starved the other packaging files' waiters (a merged run gave up after 100 s).
    const lock = join(dir, 'lock');
    const order: string[] = [];
    let waiter: Promise<void> | undefined;
    await withFileLock(
      lock,
      async () => {
        waiter = withFileLock(lock, async () => void order.push('waiter'), { waitMs: 10_000 });
        // The waiter has queued once its ticket is there (a lock without a queue gets 10 s).
        const until = Date.now() + 10_000;
        const queued = async () => ((await readdir(`${lock}.queue`).catch(() => [])).length ?? 0) > 0;
        while (!(await queued()) && Date.now() < until) await sleep(5);
      },
      { waitMs: 1_000 },
    );
    await withFileLock(lock, async () => void order.push('holder again'), { waitMs: 10_000 });
    await waiter;
    expect(order).toEqual(['waiter', 'holder again']);
  });

  it('skips the ticket of a waiter that died', async () => {
    const lock = join(dir, 'lock');
    const dead = await runChild('sh', ['-c', 'echo $$'], { cwd: dir, env: process.env });
    await mkdir(`${lock}.queue`, { recursive: true });
    await writeFile(join(`${lock}.queue`, `000000000000001-000001-${dead.stdout.trim()}-00000000`), '');
    await expect(withFileLock(lock, async () => 'next', { waitMs: 2_000 })).resolves.toBe('next');
  });

  it('queues again when its queue is removed while it waits', async () => {
    const lock = join(dir, 'lock');
    await mkdir(lock);
    await writeFile(join(lock, 'pid'), String(process.pid));
    const waiting = withFileLock(lock, async () => 'taken', { waitMs: 10_000 });
    while ((await readdir(`${lock}.queue`).catch(() => [])).length === 0) await sleep(5);
    await rm(`${lock}.queue`, { recursive: true, force: true });
    await rm(lock, { recursive: true, force: true });
    await expect(waiting).resolves.toBe('taken');
  });

  it('skips a ticket older than any wait, whatever process has its pid now', async () => {
    const lock = join(dir, 'lock');
    await mkdir(`${lock}.queue`, { recursive: true });
    // Its pid is this very process's: alive, but the ticket is from two hours ago.
    const old = String(Date.now() - 2 * 60 * 60 * 1000).padStart(15, '0');
    await writeFile(join(`${lock}.queue`, `${old}-000001-${process.pid}-00000000`), '');
    await expect(withFileLock(lock, async () => 'next', { waitMs: 2_000 })).resolves.toBe('next');
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
    for (let i = 0; i < 50 && isRunning(grandchild); i += 1) await sleep(20);
    expect(isRunning(grandchild)).toBe(false);
  });
});
