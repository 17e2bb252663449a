/**
 * Invariant P: no process of the stack exits while faults run. Every child process the chaos
 * engine starts is started here and watched for its whole life; an exit the engine did not ask
 * for (a crash: an 'error' event nobody listened to, an unhandled rejection, a signal), or an
 * asked-for stop that ends with a failure status, is a violation with its exit code or signal and
 * the last lines the process wrote on stderr and stdout.
 *
 * In Lambda a crashed process fails its whole batch, and a release batch then waits out its
 * visibility timeout: a crash is never "just a retry".
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { Invariant, type Violation } from './invariants.ts';

const TAIL_LINES = 15;

export interface WatchedProcess {
  readonly name: string;
  readonly child: ChildProcess;
  /** Lines written on stdout, kept whole (a child reports its summary there). */
  readonly stdoutLines: string[];
  /** Resolves true once a stdout line contains `text`; false if it exits or `timeoutMs` passes first. */
  waitForLine(text: string, timeoutMs: number): Promise<boolean>;
  /** Asks the process to stop (SIGTERM) and waits for its exit; the exit is then not a crash. */
  stop(timeoutMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

function tail(lines: string[], chunk: Buffer, keep: number): void {
  for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) lines.push(line.slice(0, 500));
  if (lines.length > keep) lines.splice(0, lines.length - keep);
}

export class ProcessWatch {
  readonly violations: Violation[] = [];
  /** Processes watched so far (the invariant's check count). */
  started = 0;
  readonly #live = new Set<WatchedProcess>();

  /** Starts `command args` with `env` and watches it until it exits. */
  spawn(name: string, command: string, args: readonly string[], env: NodeJS.ProcessEnv): WatchedProcess {
    const child = spawn(command, [...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.started += 1;
    const stderr: string[] = [];
    const stdoutLines: string[] = [];
    child.stderr?.on('data', (chunk: Buffer) => tail(stderr, chunk, TAIL_LINES));
    child.stdout?.on('data', (chunk: Buffer) => tail(stdoutLines, chunk, 200));
    let asked = false;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
      child.once('exit', (code, signal) => resolve({ code, signal }));
      // A process that could not even start is an exit nobody asked for.
      child.once('error', (error) => {
        stderr.push(`spawn failed: ${error.message}`);
        resolve({ code: -1, signal: null });
      });
    });
    const watched: WatchedProcess = {
      name,
      child,
      stdoutLines,
      async waitForLine(text: string, timeoutMs: number) {
        const until = performance.now() + timeoutMs;
        while (performance.now() < until) {
          if (stdoutLines.some((line) => line.includes(text))) return true;
          if (child.exitCode !== null || child.signalCode !== null) return false;
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        return false;
      },
      async stop(timeoutMs = 20_000) {
        asked = true;
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
        let timer: NodeJS.Timeout | undefined;
        const late = new Promise<'late'>((resolve) => {
          timer = setTimeout(() => resolve('late'), timeoutMs);
        });
        const outcome = await Promise.race([exited, late]);
        clearTimeout(timer);
        if (outcome === 'late') {
          child.kill('SIGKILL');
          return exited;
        }
        return outcome;
      },
    };
    this.#live.add(watched);
    void exited.then(({ code, signal }) => {
      this.#live.delete(watched);
      // Asked to stop, a clean exit (0, or the SIGTERM it was sent) is the end of its work.
      if (asked && (code === 0 || signal === 'SIGTERM')) return;
      this.violations.push({
        invariant: Invariant.NO_PROCESS_EXITS,
        key: `P:${name}:${child.pid}`,
        message: asked
          ? `${name} (pid ${child.pid}) ended with exit code ${code}${signal ? ` (signal ${signal})` : ''} when asked to stop: it reported a failure`
          : `${name} (pid ${child.pid}) exited while faults ran, with exit code ${code}${signal ? ` (signal ${signal})` : ''}, nobody asked it to`,
        details: {
          name,
          pid: child.pid,
          code,
          signal,
          asked,
          stderrTail: [...stderr],
          stdoutTail: stdoutLines.slice(-5),
        },
      });
    });
    return watched;
  }

  /** Stops whatever is still running (the engine's own shutdown). */
  async stopAll(): Promise<void> {
    await Promise.all([...this.#live].map((watched) => watched.stop().catch(() => {})));
  }
}
