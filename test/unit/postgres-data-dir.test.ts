/**
 * As root, PostgreSQL runs as the user `postgres`, which must be able to walk down to its data.
 * (test/integration/embedded-postgres.test.ts starts a real cluster from such a folder.)
 */
import { chmod, mkdir, mkdtemp, rm, stat, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PostgresDataDirectoryError } from '../../infra/local/errors.ts';
import { clusterDirectory, othersCanReach } from '../../infra/local/postgres-data-dir.ts';

let root: string;

/** A folder others may enter (as /tmp is), standing in for the temporary directory. */
async function openFolder(name: string): Promise<string> {
  const folder = join(root, name);
  await mkdir(folder, { mode: 0o755 });
  await chmod(folder, 0o755);
  return folder;
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), 'rc-data-dir-'));
  await chmod(root, 0o755);
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

describe('othersCanReach', () => {
  it('is true when every folder above lets others through, false when one does not', async () => {
    const open = join(root, 'open', 'data');
    const closed = join(root, 'closed', 'data');
    await mkdir(open, { recursive: true });
    await mkdir(closed, { recursive: true });
    await chmod(join(root, 'open'), 0o755);
    await chmod(join(root, 'closed'), 0o700);
    expect(await othersCanReach(open)).toBe(true);
    expect(await othersCanReach(closed)).toBe(false);
  });
});

describe('clusterDirectory, running as root', () => {
  it('keeps a folder the postgres user can reach, opened to it', async () => {
    const requested = join(await openFolder('reachable'), 'postgres');
    const cluster = await clusterDirectory(requested, { asRoot: true });
    expect(cluster).toEqual({ dir: requested, relocatedFrom: undefined });
    expect((await stat(requested)).mode & 0o777).toBe(0o755);
  });

  it('moves out of a folder inside a mkdtemp folder (0700), to the same place on every start', async () => {
    const scratch = await mkdtemp(join(root, 'scratch-'));
    const temp = await openFolder('temp');
    const requested = join(scratch, 'postgres');
    const first = await clusterDirectory(requested, { asRoot: true, tempDirs: [temp] });
    expect(first.relocatedFrom).toBe(requested);
    expect(first.dir.startsWith(join(temp, 'runtime-cleanup-postgres-'))).toBe(true);
    expect(await othersCanReach(first.dir)).toBe(true);
    const again = await clusterDirectory(requested, { asRoot: true, tempDirs: [temp] });
    expect(again.dir).toBe(first.dir);
  });

  it('refuses a link planted where the cluster would move, instead of following it', async () => {
    const scratch = await mkdtemp(join(root, 'scratch-'));
    const temp = await openFolder('planted');
    const requested = join(scratch, 'postgres');
    const probe = await clusterDirectory(requested, { asRoot: true, tempDirs: [temp] });
    await rm(probe.dir, { recursive: true });
    await symlink('/etc', probe.dir);
    await expect(clusterDirectory(requested, { asRoot: true, tempDirs: [temp] })).rejects.toBeInstanceOf(
      PostgresDataDirectoryError,
    );
  });

  it('says so in one line when no temporary folder is reachable either', async () => {
    const scratch = await mkdtemp(join(root, 'scratch-'));
    const error = await clusterDirectory(join(scratch, 'postgres'), {
      asRoot: true,
      tempDirs: [scratch],
    }).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(PostgresDataDirectoryError);
    expect((error as Error).message).not.toContain('\n');
    expect((error as Error).message).toContain('set DATABASE_URL');
  });
});

describe('clusterDirectory, as an ordinary user', () => {
  it('uses the folder asked for, whatever its parents allow others', async () => {
    const scratch = await mkdtemp(join(root, 'scratch-'));
    const requested = join(scratch, 'postgres');
    expect(await clusterDirectory(requested, { asRoot: false })).toEqual({
      dir: requested,
      relocatedFrom: undefined,
    });
  });
});
