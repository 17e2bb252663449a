/**
 * A fair lock between processes, held as a directory: `mkdir` either creates it or fails with
 * EEXIST, atomically, on every file system the tests run on. The holder writes its pid inside, so a
 * lock left behind by a process that died (a test worker killed at its timeout) is taken over
 * instead of blocking every later run until someone deletes it by hand.
 *
 * Waiters queue: each leaves a ticket (its arrival time and pid in the name) in `<lock>.queue/`, and
 * only the oldest live ticket may take the lock. A waiter that gives up removes its ticket; one
 * whose process died, or that is older than any wait, is skipped and removed by the next waiter. A file that takes the lock a dozen times in a row
 * (template-stage-settings packages once per case) would otherwise re-take it the moment it let go,
 * before a waiter's next poll, and starve the other packaging files (a merged run gave up after
 * 100 s so).
 *
 * Vitest runs test files in parallel worker processes; `npm run package` writes into fixed
 * directories of the project (`.esbuild/`, `.serverless/`) and deletes them when it ends, so two
 * packaging runs at once break each other. They take this lock.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const POLL_MS = 50;
/**
 * Longer than any waiter waits (the packaging files wait 240 s at most): a ticket this old was left
 * by a process killed while it waited, whose pid a later, unrelated process may have been given.
 */
const STALE_TICKET_MS = 30 * 60 * 1000;

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

/** A ticket's name sorts by arrival: milliseconds, then a counter for arrivals in the same one. */
let arrivals = 0;
function ticketName(): string {
  arrivals = (arrivals + 1) % 1_000_000;
  const at = String(Date.now()).padStart(15, '0');
  return `${at}-${String(arrivals).padStart(6, '0')}-${process.pid}-${randomBytes(4).toString('hex')}`;
}

/** Whether another process's ticket still waits: its process lives and it is not stale. */
function isWaiting(ticket: string): boolean {
  const [at, , pidText] = ticket.split('-');
  const pid = Number.parseInt(pidText ?? '', 10);
  const since = Number.parseInt(at ?? '', 10);
  if (!Number.isSafeInteger(pid) || pid <= 0 || !Number.isSafeInteger(since)) return false;
  return Date.now() - since < STALE_TICKET_MS && isAlive(pid);
}

/** Leaves a new ticket in the queue (made again if someone removed it); returns its name. */
async function queueUp(queueDir: string): Promise<string> {
  await mkdir(queueDir, { recursive: true });
  const ticket = ticketName();
  await writeFile(join(queueDir, ticket), '');
  return ticket;
}

/**
 * Whether `ticket` is first in the queue; tickets of processes that died, or stale ones, are
 * removed. Undefined if the ticket itself is gone (the queue was removed): the caller queues again.
 */
async function isFirst(queueDir: string, ticket: string): Promise<boolean | undefined> {
  const tickets = (await readdir(queueDir).catch(() => [] as string[])).sort();
  for (const other of tickets) {
    if (other === ticket) return true;
    if (isWaiting(other)) return false;
    await rm(join(queueDir, other), { force: true });
  }
  return undefined;
}

/** Takes the lock if it is free or its holder died; false if a live holder has it. */
async function tryTake(lockDir: string, state: { unreadableSince?: number }): Promise<boolean> {
  try {
    await mkdir(lockDir);
    await writeFile(join(lockDir, 'pid'), String(process.pid));
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
  }
  const pid = await holderPid(lockDir);
  if (pid === undefined) {
    // Between its mkdir and its writeFile a live holder has no pid file yet: only a lock that
    // stays without one for a while was left by a process that died in that gap.
    state.unreadableSince ??= Date.now();
    if (Date.now() - state.unreadableSince > 5_000) await rm(lockDir, { recursive: true, force: true });
  } else {
    state.unreadableSince = undefined;
    if (!isAlive(pid)) await rm(lockDir, { recursive: true, force: true });
  }
  return false;
}

/** Where the waiters of the lock at `lockDir` leave their tickets. */
function queueDirOf(lockDir: string): string {
  return `${lockDir}.queue`;
}

/** Takes the lock in arrival order, waiting up to `waitMs`; a dead holder's lock is removed. */
async function acquire(lockDir: string, waitMs: number): Promise<void> {
  const deadline = Date.now() + waitMs;
  const queueDir = queueDirOf(lockDir);
  let ticket = await queueUp(queueDir);
  const state: { unreadableSince?: number } = {};
  try {
    for (;;) {
      const first = await isFirst(queueDir, ticket);
      // Our ticket is gone (someone removed the queue): at the back again, under a new name.
      if (first === undefined) ticket = await queueUp(queueDir);
      else if (first && (await tryTake(lockDir, state))) return;
      if (Date.now() > deadline) {
        const pid = await holderPid(lockDir);
        throw new Error(`${lockDir} is still held (pid ${pid ?? 'unknown'}) after ${waitMs} ms`);
      }
      await sleep(POLL_MS);
    }
  } finally {
    // Taken or given up, the ticket's turn is over (the lock itself now keeps the others out).
    await rm(join(queueDir, ticket), { force: true });
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

/** Removes the lock at `lockDir` and its waiters' queue: for whoever owns its folder, once nobody can want it. */
export async function removeFileLock(lockDir: string): Promise<void> {
  await rm(lockDir, { recursive: true, force: true });
  await rm(queueDirOf(lockDir), { recursive: true, force: true });
}
