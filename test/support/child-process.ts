/**
 * Runs a command to its end with stdin closed and collects what it printed. With `timeoutMs` a
 * child that hangs is killed (SIGKILL), so the test fails on its output instead of at the test
 * runner's timeout with nothing to show.
 *
 * `processGroup: true` runs the child in a process group of its own and kills the whole group:
 * `npm run x` is npm → sh → the tool, and killing npm alone leaves the tool running as an orphan
 * (an osls that keeps writing into `.esbuild/` after its test gave up on it). The group is also
 * killed if the test process exits first.
 */
import { spawn } from 'node:child_process';
import { yieldSessionOf } from './cpu-priority.ts';

export interface ChildRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

function killGroup(pid: number): void {
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // The group is gone already.
  }
}

export function runChild(
  command: string,
  args: string[],
  options: { cwd: string; env: NodeJS.ProcessEnv; timeoutMs?: number; processGroup?: boolean },
): Promise<ChildRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      cwd: options.cwd,
      env: options.env,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: options.processGroup === true,
    });
    const group = options.processGroup === true ? child.pid : undefined;
    // Its own session: it must yield the CPU as this process does (cpu-priority.ts).
    if (group !== undefined) void yieldSessionOf(group);
    const kill = (): void => {
      if (group !== undefined) killGroup(group);
      else child.kill('SIGKILL');
    };
    const killOnExit = (): void => {
      if (group !== undefined) killGroup(group);
    };
    if (group !== undefined) process.once('exit', killOnExit);
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
    });
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    const timer = options.timeoutMs === undefined ? undefined : setTimeout(kill, options.timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      process.off('exit', killOnExit);
      // Whatever the leader left running in its group (a tool it started and did not wait for) ends with it.
      if (group !== undefined) killGroup(group);
      resolve({ code, stdout, stderr });
    });
  });
}
