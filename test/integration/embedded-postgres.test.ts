/**
 * The embedded PostgreSQL from a fresh clone, as root and as an ordinary user: a real cluster
 * started from a folder inside a mkdtemp folder (mode 0700), which as root the postgres user
 * cannot enter (this is where `npm run chaos` put it), and real binaries that fail in the real
 * dynamic loader for want of a library.
 */
import { existsSync } from 'node:fs';
import {
  chmod,
  chown,
  copyFile,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  rm,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { openDatabase } from '../../functions/adapters/database.ts';
import { startEmbeddedPostgres } from '../../infra/local/embedded-postgres.ts';
import { PostgresLibraryMissingError } from '../../infra/local/errors.ts';
import {
  assertBinariesLoad,
  binariesPostgresCanRun,
  embeddedBinaries,
  type PostgresBinaries,
} from '../../infra/local/postgres-binaries.ts';
import { runningAsRoot } from '../../infra/local/postgres-data-dir.ts';
import { initCluster, postgresUser, startPostmaster } from '../../infra/local/postgres-process.ts';

let scratch: string;
beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'rc-embedded-test-'));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

describe('an embedded PostgreSQL started from a folder inside a mkdtemp folder', () => {
  it('starts, answers, and leaves nothing behind when stopped', async () => {
    const requested = join(scratch, 'cluster', 'postgres');
    await mkdir(dirname(requested), { mode: 0o700 });
    const cluster = await startEmbeddedPostgres({ dataDir: requested, persistent: false });
    try {
      // As root the cluster had to move where the postgres user can reach it; otherwise not.
      expect(cluster.relocatedFrom).toBe(runningAsRoot() ? requested : undefined);
      const db = await openDatabase({
        url: cluster.url,
        driver: inject('database').driver,
        wsProxy: inject('database').wsProxy,
        maxConnections: 1,
        lockTimeoutMs: 5_000,
        statementTimeoutMs: 10_000,
      });
      const { rows } = await db.query<{ user: string }>('SELECT current_user AS user');
      await db.end();
      expect(rows[0]?.user).toBe('postgres');
    } finally {
      await cluster.stop();
    }
    expect(cluster.postmasterPid).toBeDefined();
    expect(() => process.kill(cluster.postmasterPid!, 0)).toThrow();
    // Not persistent: its data is gone, and so is a folder made for it elsewhere.
    expect(existsSync(join(cluster.dataDir, 'pgdata'))).toBe(false);
    expect(existsSync(cluster.dataDir)).toBe(cluster.relocatedFrom === undefined);
  });
});

/**
 * A copy of the real initdb whose dynamic section names `libicuqq.so.60` where it named
 * `libicuuc.so.60` (same length, so the ELF stays valid): no machine has that library, so the
 * loader fails the same way everywhere. Its RUNPATH ($ORIGIN/../lib) points at a lib folder of
 * the test's making, holding every bundled library, and, with `shipUnlinked`, `libicuqq.so.60.2`
 * without the `libicuqq.so.60` link the package's install script would have made.
 */
async function brokenBinaries(where: string, options: { shipUnlinked: boolean }): Promise<PostgresBinaries> {
  const real = await embeddedBinaries();
  const realLib = join(dirname(dirname(real.initdb)), 'lib');
  const bin = join(where, 'native', 'bin');
  const lib = join(where, 'native', 'lib');
  await mkdir(bin, { recursive: true });
  await mkdir(lib, { recursive: true });
  const image = await readFile(real.initdb);
  const patched = Buffer.from(image);
  const from = Buffer.from('libicuuc.so.60\0');
  const to = Buffer.from('libicuqq.so.60\0');
  let replaced = 0;
  for (let at = patched.indexOf(from); at !== -1; at = patched.indexOf(from, at + 1)) {
    to.copy(patched, at);
    replaced += 1;
  }
  expect(replaced, 'initdb names libicuuc.so.60 in its dynamic section').toBeGreaterThan(0);
  const initdb = join(bin, 'initdb');
  await writeFile(initdb, patched, { mode: 0o755 });
  for (const file of await readdir(realLib)) await symlink(join(realLib, file), join(lib, file));
  if (options.shipUnlinked) await copyFile(join(realLib, 'libicuuc.so.60.2'), join(lib, 'libicuqq.so.60.2'));
  return { packageName: real.packageName, initdb, postgres: initdb };
}

describe('binaries that lack a shared library', () => {
  it('the real embedded binaries load on this machine', async () => {
    await expect(assertBinariesLoad(await embeddedBinaries())).resolves.toBeUndefined();
  });

  it('a library the package ships but never linked: one line naming it and the rebuild that links it', async () => {
    const binaries = await brokenBinaries(join(scratch, 'unlinked'), { shipUnlinked: true });
    const error = await assertBinariesLoad(binaries).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(PostgresLibraryMissingError);
    expect((error as PostgresLibraryMissingError).library).toBe('libicuqq.so.60');
    expect((error as Error).message).toBe(
      `embedded PostgreSQL cannot start: ${binaries.initdb} needs libicuqq.so.60, which this machine lacks; the package ships it as libicuqq.so.60.2 but its install script, which links it, did not run: run \`npm rebuild ${binaries.packageName}\` (or set DATABASE_URL to a PostgreSQL of your own)`,
    );
  });

  it('a library nothing ships: one line naming it and how to find what installs it', async () => {
    const binaries = await brokenBinaries(join(scratch, 'absent'), { shipUnlinked: false });
    const error = await assertBinariesLoad(binaries).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(PostgresLibraryMissingError);
    expect((error as Error).message).not.toContain('\n');
    expect((error as Error).message).toContain(
      'needs libicuqq.so.60, which this machine lacks; install the package that provides libicuqq.so.60',
    );
  });
});

describe('starting fails with the reason, never by waiting forever', () => {
  it('a binary that cannot be run (EACCES, as the postgres user meets node_modules under /root)', async () => {
    const notExecutable = join(scratch, 'not-executable-postgres');
    await writeFile(notExecutable, '#!/bin/sh\n', { mode: 0o644 });
    await expect(
      startPostmaster({
        postgres: notExecutable,
        pgdata: join(scratch, 'none'),
        clusterDir: scratch,
        port: 1,
        flags: [],
        identity: {},
      }),
    ).rejects.toThrow(/PostgreSQL could not be started: spawn .*EACCES/);
  });

  it('initdb that fails: its own words in the error', async () => {
    // Where the postgres user can reach everything (as root too), so the one problem is the one made here.
    const { initdb } = await binariesPostgresCanRun(await embeddedBinaries());
    const identity = await postgresUser();
    const open = await mkdtemp(join(tmpdir(), 'rc-initdb-'));
    await chmod(open, 0o755);
    try {
      const occupied = join(open, 'occupied');
      await mkdir(occupied, { mode: 0o700 });
      await writeFile(join(occupied, 'something'), 'not a cluster');
      if (identity.uid !== undefined) await chown(occupied, identity.uid, identity.gid ?? identity.uid);
      const failure = initCluster({
        initdb,
        pgdata: occupied,
        clusterDir: open,
        user: 'postgres',
        password: 'x',
        identity,
        sync: false,
      });
      await expect(failure).rejects.toThrow(/^initdb failed \(exit status 1\): .*exists but is not empty/);
    } finally {
      await rm(open, { recursive: true, force: true });
    }
  });
});
