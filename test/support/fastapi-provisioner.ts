import { execFile, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

/**
 * A real FastAPI provisioner that behaves as the agent platform's own does
 * (test/platform/fastapi-provisioner/app.py), run by Debian's uvicorn on a free port (port 0: the
 * port is read from uvicorn's own "Uvicorn running on" line, logged once it listens). The
 * platform tier (`npm run test:platform`) needs Debian's `python3-fastapi` and `python3-uvicorn`;
 * `.ci/run` installs them, `npm test` never runs this tier.
 *
 * Debian's interpreter, /usr/bin/python3, in isolated mode (`-I`: no PYTHON* variables, no user
 * site-packages, so a pyenv shim or a virtualenv cannot swap the packages under test) and without
 * writing bytecode next to the app (`-B`).
 */
export const PYTHON = '/usr/bin/python3';
const APP_DIR = fileURLToPath(new URL('../platform/fastapi-provisioner/', import.meta.url));
const READY_LINE = /Uvicorn running on http:\/\/127\.0\.0\.1:(\d+)/;
const STARTUP_TIMEOUT_MS = 20_000;
const STOP_TIMEOUT_MS = 5_000;

export interface FastApiProvisionerOptions {
  /** The API's path prefix, as behind a gateway route (`/provisioner`); none by default. */
  prefix?: string;
  /** When set, every API request must carry `Authorization: Bearer <token>`. */
  token?: string;
  /** How an unknown sandbox's DELETE is answered: 200 (the platform's provisioner, default) or 404. */
  absentStatus?: 200 | 404;
  /** The idle reaper deletes sandboxes unused this long; off by default. */
  idleTimeoutSeconds?: number;
}

/** One request the app's API saw (`/_test/requests`); `bearer` says whether its token was right. */
export interface FastApiRequest {
  method: string;
  path: string;
  query: string;
  status: number;
  bearer: 'none' | 'valid' | 'invalid';
}

export interface FastApiProvisioner {
  /** The base URL its API answers at: the origin plus the prefix. */
  readonly url: string;
  /** `http://127.0.0.1:<port>`. */
  readonly origin: string;
  /** The live sandboxes, from its own listing (with its token). */
  sandboxIds(): Promise<string[]>;
  /** Every API request it has seen, oldest first. */
  requests(): Promise<FastApiRequest[]>;
  clearRequests(): Promise<void>;
  /** What uvicorn printed (its access log included). */
  output(): string;
  stop(): Promise<void>;
}

const checked = new Map<string, Promise<void>>();

/**
 * Fails with one line naming what is missing and how to install it: python3 itself, or one of
 * Debian's packages that provide `modules`.
 */
export function requirePythonModules(
  modules: readonly string[],
  debianPackages: readonly string[],
): Promise<void> {
  const key = modules.join(', ');
  let check = checked.get(key);
  if (!check) {
    check = (async () => {
      const install = `apt-get install -y ${debianPackages.join(' ')} (Debian; .ci/run does it)`;
      try {
        await promisify(execFile)(PYTHON, ['-I', '-B', '-c', `import ${key}`]);
      } catch (error) {
        const { code, stderr } = error as { code?: unknown; stderr?: string };
        const missing = /No module named '?([\w.]+)'?/.exec(stderr ?? '')?.[1];
        const what =
          code === 'ENOENT'
            ? `${PYTHON} does not exist`
            : missing
              ? `${PYTHON} has no module ${missing}`
              : `${PYTHON} cannot import ${key}: ${(stderr ?? String(error)).trim().split('\n').at(-1)}`;
        throw new Error(`the platform test tier needs Debian's Python with ${key}: ${what}; ${install}`);
      }
    })();
    checked.set(key, check);
  }
  return check;
}

/** FastAPI and uvicorn, for the provisioner app. */
export function requirePythonDependencies(): Promise<void> {
  return requirePythonModules(['fastapi', 'uvicorn'], ['python3-fastapi', 'python3-uvicorn']);
}

export async function startFastApiProvisioner(
  options: FastApiProvisionerOptions = {},
): Promise<FastApiProvisioner> {
  await requirePythonDependencies();
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    PROVISIONER_PREFIX: options.prefix ?? '',
    PROVISIONER_ABSENT_STATUS: String(options.absentStatus ?? 200),
    ...(options.token !== undefined ? { PROVISIONER_TOKEN: options.token } : {}),
    ...(options.idleTimeoutSeconds !== undefined
      ? { SANDBOX_IDLE_TIMEOUT_SECONDS: String(options.idleTimeoutSeconds) }
      : {}),
  };
  const args = [
    '-I',
    '-B',
    '-m',
    'uvicorn',
    '--app-dir',
    APP_DIR,
    '--factory',
    'app:create_app',
    '--host',
    '127.0.0.1',
    '--port',
    '0',
  ];
  const child = spawn(PYTHON, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`uvicorn did not start within ${STARTUP_TIMEOUT_MS} ms: ${tail(output)}`));
    }, STARTUP_TIMEOUT_MS);
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const match = READY_LINE.exec(output);
      if (match) {
        clearTimeout(timer);
        resolve(Number(match[1]));
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`uvicorn exited (${signal ?? code}) before it listened: ${tail(output)}`));
    });
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
  }).catch((error: Error) => {
    process.off('exit', killOnExit);
    throw error;
  });
  const origin = `http://127.0.0.1:${port}`;
  const url = `${origin}${(options.prefix ?? '').replace(/\/+$/, '')}`;
  const auth: Record<string, string> =
    options.token !== undefined ? { authorization: `Bearer ${options.token}` } : {};
  const json = async <T>(target: string, init: RequestInit = {}): Promise<T> => {
    const response = await fetch(target, init);
    if (!response.ok)
      throw new Error(`${init.method ?? 'GET'} ${target}: ${response.status} ${await response.text()}`);
    return (await response.json()) as T;
  };
  return {
    url,
    origin,
    async sandboxIds() {
      const listing = await json<{ sandboxes: Array<{ sandbox_id: string }> }>(`${url}/api/sandboxes`, {
        headers: auth,
      });
      return listing.sandboxes.map((sandbox) => sandbox.sandbox_id);
    },
    requests: () => json<FastApiRequest[]>(`${origin}/_test/requests`),
    async clearRequests() {
      await json(`${origin}/_test/requests`, { method: 'DELETE' });
    },
    output: () => output,
    async stop() {
      process.off('exit', killOnExit);
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      // SIGTERM: uvicorn's graceful shutdown; SIGKILL if it does not end in time.
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS);
      await exited;
      clearTimeout(timer);
    },
  };
}

function tail(output: string): string {
  return output.trim().split('\n').slice(-3).join(' | ') || '(no output)';
}
