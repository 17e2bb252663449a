import { readFileSync } from 'node:fs';

/**
 * Running, as /proc sees it. `kill(pid, 0)` also succeeds for a zombie: a process that has exited
 * but whose parent has not reaped it yet. An orphan's new parent (PID 1, or a subreaper) may take a
 * second or more to reap it, or never do so (a shell or npm as a container's PID 1), so a test that
 * asks whether a process exited reads its state instead.
 */
export function isRunning(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}
