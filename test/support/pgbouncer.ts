import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { access, chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';

/**
 * A real PgBouncer (Debian's `pgbouncer`, 1.18 here) in transaction mode, started on a free port
 * in front of a PostgreSQL: what Neon's pooled endpoint is. Tests start their own; nothing
 * assumes one is running. `.ci/run` installs the package when it is missing.
 *
 * Every database name is forwarded to the same-named database of the target (`*` entry), and
 * PgBouncer logs in to PostgreSQL as `server.user` whatever user the client authenticated as, so
 * the test databases created per file work through it unchanged.
 */
export interface PgBouncer {
  readonly port: number;
  /** `postgres://<user>@127.0.0.1:<port>/<database>`: the same database, through the pooler. */
  url(database: string): string;
  stop(): Promise<void>;
}

export interface PgBouncerOptions {
  target: { host: string; port: number };
  /** The role PgBouncer logs in as, with its password if the server asks for one. */
  server: { user: string; password?: string };
  /**
   * Server connections per database and user. Lock tests hold a transaction open while probing
   * from another one, and the e2e stack runs 20+ concurrent transactions: both need their own
   * server connection at the same moment, or they would queue behind each other in the pooler.
   */
  poolSize?: number;
}

const PGBOUNCER_CANDIDATES = ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer', '/usr/local/bin/pgbouncer'];
/** The line PgBouncer 1.x logs once it listens (`process up: PgBouncer 1.18.0, …`). */
const READY_LINE = /process up: PgBouncer/;
const STARTUP_TIMEOUT_MS = 10_000;

export async function findPgBouncer(): Promise<string> {
  const configured = process.env.PGBOUNCER_BIN;
  const candidates = configured ? [configured] : [...PGBOUNCER_CANDIDATES];
  for (const candidate of candidates) {
    try {
      await access(candidate);
      return candidate;
    } catch {}
  }
  throw new Error(
    `pgbouncer not found (looked for ${candidates.join(', ')}): install it (Debian: apt-get install pgbouncer; .ci/run does) or set PGBOUNCER_BIN`,
  );
}

/** A value for a `key=value` connection setting or a user list entry, refused if it would not parse. */
function plain(value: string): string {
  if (!/^[\w.@-]*$/.test(value))
    throw new Error(`"${value}" cannot be written into a PgBouncer configuration`);
  return value;
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * PgBouncer refuses to run as root ("PgBouncer should not run as root"); as root it is started
 * with `-u <user>` and its files belong to that user. `postgres` exists wherever a PostgreSQL
 * package is installed; `nobody` everywhere else.
 */
async function unprivilegedUser(): Promise<{ name: string; uid: number; gid: number } | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const run = promisify(execFile);
  for (const name of ['postgres', 'nobody']) {
    try {
      const uid = Number((await run('id', ['-u', name])).stdout.trim());
      const gid = Number((await run('id', ['-g', name])).stdout.trim());
      return { name, uid, gid };
    } catch {}
  }
  throw new Error('running as root, and neither a "postgres" nor a "nobody" user exists to run pgbouncer as');
}

function config(options: PgBouncerOptions, port: number, dir: string): string {
  return `[databases]
* = host=${plain(options.target.host)} port=${options.target.port} user=${plain(options.server.user)}${
    options.server.password === undefined ? '' : ` password=${plain(options.server.password)}`
  }

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
; Clients are the tests themselves: PgBouncer only checks that the user is listed.
auth_type = trust
auth_file = ${join(dir, 'userlist.txt')}
pool_mode = transaction
max_client_conn = 1000
default_pool_size = ${options.poolSize ?? 40}
; Server connections go back to PostgreSQL soon after use: the machine's PostgreSQL is shared
; with other suites, and an idle pooled connection to a test database would also block its DROP.
server_idle_timeout = 5
server_lifetime = 60
; node-postgres sends none of these today; a driver upgrade that did must not fail every connect.
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
log_pooler_errors = 1
; The admin console (database "pgbouncer": SHOW POOLS, SHOW CONFIG) lets a test see that it
; really goes through this pooler, in transaction mode.
admin_users = ${plain(options.server.user)}
`;
}

export async function startPgBouncer(options: PgBouncerOptions): Promise<PgBouncer> {
  const binary = await findPgBouncer();
  const runAs = await unprivilegedUser();
  const dir = await mkdtemp(join(tmpdir(), 'rc-pgbouncer-'));
  const userlistPath = join(dir, 'userlist.txt');

  let child: ChildProcess | undefined;
  let port = 0;
  let lastOutput = '';
  // A free port found by binding 0 can be taken by another process before PgBouncer binds it:
  // try again on a new port rather than fail the suite on that race.
  for (let attempt = 1; attempt <= 3 && !child; attempt += 1) {
    port = await freePort();
    const configPath = join(dir, 'pgbouncer.ini');
    await writeFile(configPath, config(options, port, dir));
    await writeFile(userlistPath, `"${plain(options.server.user)}" ""\n`, { mode: 0o600 });
    if (runAs) {
      for (const path of [dir, configPath, userlistPath]) await chown(path, runAs.uid, runAs.gid);
      await chmod(dir, 0o700);
    }
    const args = [...(runAs ? ['-u', runAs.name] : []), configPath];
    const started = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const ready = await new Promise<boolean>((resolve) => {
      let output = '';
      const timer = setTimeout(() => resolve(false), STARTUP_TIMEOUT_MS);
      const onData = (chunk: Buffer) => {
        output += chunk.toString();
        if (READY_LINE.test(output)) {
          clearTimeout(timer);
          resolve(true);
        }
      };
      started.stdout!.on('data', onData);
      started.stderr!.on('data', onData);
      started.once('exit', () => {
        clearTimeout(timer);
        lastOutput = output;
        resolve(false);
      });
      started.once('error', (error) => {
        clearTimeout(timer);
        lastOutput = error.message;
        resolve(false);
      });
    });
    if (ready) {
      child = started;
      // Keep draining its log, or a full pipe would block PgBouncer.
      started.stdout!.resume();
      started.stderr!.resume();
    } else {
      started.kill('SIGKILL');
    }
  }
  if (!child) {
    await rm(dir, { recursive: true, force: true });
    throw new Error(`pgbouncer did not start: ${lastOutput.trim().split('\n').slice(-3).join(' | ')}`);
  }
  const running = child;

  return {
    port,
    url(database) {
      const url = new URL(`postgres://127.0.0.1:${port}/${database}`);
      url.username = options.server.user;
      return url.toString();
    },
    async stop() {
      if (running.exitCode === null && running.signalCode === null) {
        const exited = new Promise<void>((resolve) => running.once('exit', () => resolve()));
        // SIGTERM is PgBouncer's immediate shutdown (SIGINT would wait for clients to leave).
        running.kill('SIGTERM');
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * `DATABASE_POOLER=pgbouncer` runs the suites once more with every test database reached through
 * a PgBouncer in transaction mode (`npm run test:pgbouncer`, and CI). Unset, the tests connect
 * directly. Anything else is a typo that would silently test the direct path: refused.
 */
export function poolerRequested(env: Readonly<Record<string, string | undefined>> = process.env): boolean {
  const value = env.DATABASE_POOLER?.trim();
  if (!value) return false;
  if (value === 'pgbouncer') return true;
  throw new Error(`DATABASE_POOLER="${value}" is invalid: must be "pgbouncer" or unset`);
}

/** A PgBouncer in front of the PostgreSQL that `adminUrl` names, logging in as its user. */
export function startPoolerFor(adminUrl: string): Promise<PgBouncer> {
  const url = new URL(adminUrl);
  return startPgBouncer({
    target: { host: url.hostname.replace(/^\[|\]$/g, ''), port: Number(url.port || 5432) },
    server: {
      user: decodeURIComponent(url.username || 'postgres'),
      ...(url.password ? { password: decodeURIComponent(url.password) } : {}),
    },
  });
}

/** The same database as `url`, through the pooler on `port` (which holds the server password). */
export function throughPooler(url: string, port: number): string {
  const pooled = new URL(url);
  pooled.hostname = '127.0.0.1';
  pooled.port = String(port);
  pooled.password = '';
  return pooled.toString();
}

/**
 * Makes the pooler on `port` close its server connections to `database` as each is released
 * (the admin console's RECONNECT), so that the next transactions log in again. A login-time
 * setting (`ALTER DATABASE ... SET`) reaches pooled transactions only through new server
 * connections: without this, one test's database default would outlive it in the pool and reach
 * the next test's transactions. `url` is any URL of the pooler's admin user.
 */
export async function reconnectServers(url: string, port: number, database: string): Promise<void> {
  const console = new URL(throughPooler(url, port));
  console.pathname = '/pgbouncer';
  const client = new pg.Client({ connectionString: console.toString() });
  await client.connect();
  try {
    // The admin console takes no parameters; the name is made of hex digits by createTestDatabase.
    if (!/^[a-z0-9_]+$/.test(database)) throw new Error(`not a test database name: ${database}`);
    await client.query(`RECONNECT ${database}`);
  } finally {
    await client.end();
  }
}
