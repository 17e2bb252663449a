/**
 * Starts a TypeScript module of the benchmark in its own Node process (same Node, tsx loader) and
 * resolves with the JSON object of its first stdout line. The child watches its stdin, so it ends
 * with its parent even if the parent is killed.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export interface ChildHandle<Ready> {
  ready: Ready;
  pid: number;
  stop(): Promise<void>;
}

export async function startChild<Ready>(moduleUrl: URL, timeoutMs = 30_000): Promise<ChildHandle<Ready>> {
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(moduleUrl)], {
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, NODE_OPTIONS: '--disable-warning=ExperimentalWarning' },
  });
  const exited = once(child, 'exit');
  const lines = createInterface({ input: child.stdout! });
  const firstLine = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${moduleUrl.pathname} did not start in ${timeoutMs} ms`)),
      timeoutMs,
    );
    lines.once('line', (line) => {
      clearTimeout(timer);
      resolve(line);
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${moduleUrl.pathname} exited with ${code} before it was ready`));
    });
  });
  let ready: Ready;
  try {
    ready = JSON.parse(await firstLine) as Ready;
  } catch (error) {
    child.kill('SIGKILL');
    throw error;
  }
  return {
    ready,
    pid: child.pid!,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.stdin!.end();
      child.kill('SIGTERM');
      await exited;
    },
  };
}
