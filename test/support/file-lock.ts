/**
 * A lock between processes, held as a directory: `mkdir` either creates it or fails with EEXIST,
 * atomically, on every file system the tests run on. The holder writes its pid inside, so a lock
 * left behind by a process that died (a test worker killed at its timeout) is taken over instead
 * of blocking every later run until someone deletes it by hand.
 *
 * Vitest runs test files in parallel worker processes; `npm run package` writes into fixed
 * directories of the project (`.esbuild/`, `.serverless/`) and deletes them when it ends, so two
 * packaging runs at once break each other. They take this lock.
 */
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const POLL_MS = 100;

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    // EPERM: it exists but belongs to someone else: alive.
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function holderPid(lockDir: string): Promise<number | undefined> {
  try {
    const pid = Number.parseInt(await readFile(join(lockDir, 'pid'), 'utf8'), 10);
    return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** Takes the lock, waiting up to `waitMs` for its holder; a dead holder's lock is removed. */
async function acquire(lockDir: string, waitMs: number): Promise<void> {
  const deadline = Date.now() + waitMs;
  let unreadableSince: number | undefined;
  for (;;) {
    try {
      await mkdir(lockDir);
      await writeFile(join(lockDir, 'pid'), String(process.pid));
      return;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
    const pid = await holderPid(lockDir);
    if (pid === undefined) {
      // Between its mkdir and its writeFile a live holder has no pid file yet: only a lock that
      // stays without one for a while was left by a process that died in that gap.
      unreadableSince ??= Date.now();
      if (Date.now() - unreadableSince > 5_000) await rm(lockDir, { recursive: true, force: true });
    } else {
      unreadableSince = undefined;
      if (!isAlive(pid)) await rm(lockDir, { recursive: true, force: true });
    }
    if (Date.now() > deadline) {
      throw new Error(`${lockDir} is still held (pid ${pid ?? 'unknown'}) after ${waitMs} ms`);
    }
    await sleep(POLL_MS);
  }
}

/** Runs `work` while holding the lock at `lockDir`; releases it however `work` ends. */
export async function withFileLock<T>(
  lockDir: string,
  work: () => Promise<T>,
  options: { waitMs: number },
): Promise<T> {
  await acquire(lockDir, options.waitMs);
  try {
    return await work();
  } finally {
    await rm(lockDir, { recursive: true, force: true });
  }
}
