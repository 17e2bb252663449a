/**
 * Runs the real `npm run package` (osls + serverless-esbuild) and reads what it wrote: the
 * CloudFormation template and the function zips. Tests assert on the generated artifact, not on
 * serverless.yml, because the artifact is what CloudFormation and Lambda receive.
 *
 * osls and serverless-esbuild work in fixed directories of the project (`.esbuild/`,
 * `.serverless/`) and delete them when they finish, whatever `--package` says; Vitest runs the
 * test files that package in parallel processes. So every run takes a lock between processes
 * first (PACKAGE_LOCK_DIR), and runs in a process group of its own that is killed whole if it
 * hangs: killing npm alone would leave osls running as an orphan, still writing into `.esbuild/`.
 */
import { createHash } from 'node:crypto';
import { cp, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { inflateRawSync } from 'node:zlib';
import { runChild } from './child-process.ts';
import { withFileLock } from './file-lock.ts';

export const PROJECT_ROOT = new URL('../..', import.meta.url).pathname;

/** Held by whichever test process is packaging this working copy (see the header). */
export const PACKAGE_LOCK_DIR = join(PROJECT_ROOT, '.package.lock');

/** A package run takes about ten seconds; one that takes this long is hung. */
const PACKAGE_TIMEOUT_MS = 90_000;
/**
 * Enough for the other test files' packaging runs to finish before this one starts: four files
 * package, one of them a dozen times, and with every database pass in one run on two cores a
 * waiter once gave up after 100 s behind them. The files that wait in a hook allow for it.
 */
const PACKAGE_LOCK_WAIT_MS = 240_000;

export interface CfnResource {
  Type: string;
  Properties?: Record<string, unknown>;
  DependsOn?: string | string[];
}

export interface CfnTemplate {
  Resources: Record<string, CfnResource>;
  Outputs?: Record<string, { Value: unknown; Description?: string }>;
}

export interface PackageRun {
  code: number | null;
  output: string;
}

/**
 * `npm run package -- <args>` in a bare environment: PATH and an empty HOME (and the run's Node
 * compile cache) only, so no AWS credentials, profile, region or `~/.aws`, and none of the
 * developer's configuration variables, the way a fresh clone on CI sees it. `env` adds what a test
 * means to pass.
 */
export async function runPackage(
  args: string[],
  options: { env?: Record<string, string>; home: string },
): Promise<PackageRun> {
  return withFileLock(PACKAGE_LOCK_DIR, () => runPackageLocked(args, options), {
    waitMs: PACKAGE_LOCK_WAIT_MS,
  });
}

async function runPackageLocked(
  args: string[],
  options: { env?: Record<string, string>; home: string },
): Promise<PackageRun> {
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    HOME: options.home,
    // Node's compile cache of the run (vitest.config.ts): how fast osls starts, not what it packages.
    ...(process.env.NODE_COMPILE_CACHE ? { NODE_COMPILE_CACHE: process.env.NODE_COMPILE_CACHE } : {}),
    ...options.env,
  };
  const run = await runChild('npm', ['run', '--silent', 'package', '--', ...args], {
    cwd: PROJECT_ROOT,
    env,
    timeoutMs: PACKAGE_TIMEOUT_MS,
    processGroup: true,
  });
  return { code: run.code, output: `${run.stdout}${run.stderr}` };
}

/**
 * The production stage as template-production.test.ts reads it, packaged-bundles.test.ts runs it
 * and template-local.test.ts compares it with a serverless.yml without the local stage, with an
 * alarm subscription (packageProduction).
 */
export const PRODUCTION_ALARM_SUBSCRIPTION = 'oncall@example.com';
export const PRODUCTION_PACKAGING = {
  stage: 'prod',
  args: ['--param', `alarmSubscription=${PRODUCTION_ALARM_SUBSCRIPTION}`],
} as const;

/**
 * The production stage packaged with PRODUCTION_PACKAGING's options, once per run: the one call the
 * files that share it make, so that none can ask for other options and miss the shared packaging.
 */
export function packageProduction(options: { outputDir: string; home: string }): Promise<PackagedService> {
  return packageService({
    stage: PRODUCTION_PACKAGING.stage,
    args: [...PRODUCTION_PACKAGING.args],
    ...options,
    oncePerRun: true,
  });
}

/**
 * A packaging file's temporary folder, with an empty HOME inside it: osls reads and writes its own
 * state under HOME, which must be neither the user's nor another file's.
 */
export async function packagingWorkDir(name: string): Promise<{ workDir: string; home: string }> {
  const workDir = await mkdtemp(join(tmpdir(), `runtime-cleanup-${name}-`));
  const home = join(workDir, 'home');
  await mkdir(home);
  return { workDir, home };
}

/**
 * Where one Vitest run keeps the packagings its files may share: its workers' parent is the run's
 * main process, whose global setup removes the folder at teardown (global-setup.ts).
 */
export function packageCacheDir(mainPid: number = process.ppid): string {
  return join(tmpdir(), `runtime-cleanup-package-cache-${mainPid}`);
}

/**
 * A packaging of this checkout with these options, once per test run: files that read the same
 * stage's artifact share one packaging of the same commit and options (the ci stage:
 * template.test.ts, template-stage-settings.test.ts and packaged-bundles.test.ts; the prod stage,
 * packageProduction: template-production.test.ts, template-local.test.ts and
 * packaged-bundles.test.ts, which runs in each database pass). Taken under the lock, so a second
 * asker waits for the first packaging and copies it.
 */
async function packageOnce(
  args: string[],
  options: { env?: Record<string, string>; home: string; outputDir: string },
): Promise<PackageRun> {
  const key = createHash('sha256')
    .update(JSON.stringify({ args: args.filter((arg) => arg !== options.outputDir), env: options.env ?? {} }))
    .digest('hex')
    .slice(0, 16);
  const cached = join(packageCacheDir(), key);
  return withFileLock(
    PACKAGE_LOCK_DIR,
    async () => {
      const done = await readFile(join(cached, 'output.txt'), 'utf8').catch(() => undefined);
      if (done !== undefined) {
        await cp(join(cached, 'package'), options.outputDir, { recursive: true });
        return { code: 0, output: done };
      }
      const run = await runPackageLocked(args, options);
      if (run.code === 0) {
        await rm(cached, { recursive: true, force: true });
        await cp(options.outputDir, join(cached, 'package'), { recursive: true });
        // Written last: a folder without it is a copy that did not finish.
        await writeFile(join(cached, 'output.txt'), run.output);
      }
      return run;
    },
    { waitMs: PACKAGE_LOCK_WAIT_MS },
  );
}

export interface PackagedService {
  template: CfnTemplate;
  /** Function key → path of its zip. */
  artifacts: Map<string, string>;
  output: string;
}

/**
 * Packages into `outputDir` (osls `--package`) and reads the update-stack template and the zips.
 * `args` adds options, e.g. `['--param', 'alarmSubscription=…']`.
 */
export async function packageService(options: {
  stage: string;
  outputDir: string;
  home: string;
  env?: Record<string, string>;
  args?: string[];
  /** Copy this run's earlier packaging with the same options, if there is one (packageOnce). */
  oncePerRun?: boolean;
}): Promise<PackagedService> {
  const args = ['--stage', options.stage, '--package', options.outputDir, ...(options.args ?? [])];
  const run = options.oncePerRun ? await packageOnce(args, options) : await runPackage(args, options);
  if (run.code !== 0) throw new Error(`npm run package failed (exit ${run.code}):\n${run.output}`);
  const template = JSON.parse(
    await readFile(join(options.outputDir, 'cloudformation-template-update-stack.json'), 'utf8'),
  ) as CfnTemplate;
  const artifacts = new Map<string, string>();
  for (const file of await readdir(options.outputDir)) {
    if (file.endsWith('.zip')) artifacts.set(file.slice(0, -'.zip'.length), join(options.outputDir, file));
  }
  return { template, artifacts, output: run.output };
}

/**
 * The entries of a zip file, inflated. Enough of the format for what osls writes (stored or
 * deflated entries, no zip64), so the tests need no unzip tool and no extra package.
 */
export async function readZip(path: string): Promise<Map<string, Buffer>> {
  const zip = await readFile(path);
  const END_OF_CENTRAL_DIRECTORY = 0x06054b50;
  let end = zip.length - 22;
  while (end >= 0 && zip.readUInt32LE(end) !== END_OF_CENTRAL_DIRECTORY) end -= 1;
  if (end < 0) throw new Error(`${path}: not a zip file`);
  const count = zip.readUInt16LE(end + 10);
  let offset = zip.readUInt32LE(end + 16);
  const entries = new Map<string, Buffer>();
  for (let index = 0; index < count; index += 1) {
    const method = zip.readUInt16LE(offset + 10);
    const compressedSize = zip.readUInt32LE(offset + 20);
    const nameLength = zip.readUInt16LE(offset + 28);
    const extraLength = zip.readUInt16LE(offset + 30);
    const commentLength = zip.readUInt16LE(offset + 32);
    const localHeader = zip.readUInt32LE(offset + 42);
    const name = zip.toString('utf8', offset + 46, offset + 46 + nameLength);
    const dataStart =
      localHeader + 30 + zip.readUInt16LE(localHeader + 26) + zip.readUInt16LE(localHeader + 28);
    const data = zip.subarray(dataStart, dataStart + compressedSize);
    if (!name.endsWith('/')) entries.set(name, method === 8 ? inflateRawSync(data) : Buffer.from(data));
    offset += 46 + nameLength + extraLength + commentLength;
  }
  return entries;
}

/** Resources of one CloudFormation type, by logical ID. */
export function resourcesOfType(template: CfnTemplate, type: string): Array<[string, CfnResource]> {
  return Object.entries(template.Resources).filter(([, resource]) => resource.Type === type);
}

/** `{ "Fn::GetAtt": [id, attribute] }` or `{ Ref: id }` → id; anything else → undefined. */
export function referencedLogicalId(value: unknown): string | undefined {
  if (typeof value !== 'object' || value === null) return undefined;
  const getAtt = (value as { 'Fn::GetAtt'?: unknown })['Fn::GetAtt'];
  if (Array.isArray(getAtt) && typeof getAtt[0] === 'string') return getAtt[0];
  const ref = (value as { Ref?: unknown }).Ref;
  return typeof ref === 'string' ? ref : undefined;
}

/** Every logical ID the template refers to through Ref, Fn::GetAtt or `${…}` in Fn::Sub. */
export function referencedLogicalIds(node: unknown, found = new Set<string>()): Set<string> {
  if (Array.isArray(node)) {
    for (const item of node) referencedLogicalIds(item, found);
    return found;
  }
  if (typeof node !== 'object' || node === null) return found;
  for (const [key, value] of Object.entries(node)) {
    if (key === 'Ref' && typeof value === 'string') found.add(value);
    else if (key === 'Fn::GetAtt' && Array.isArray(value) && typeof value[0] === 'string')
      found.add(value[0]);
    else if (key === 'Fn::Sub') {
      const [text, variables] = Array.isArray(value) ? value : [value, {}];
      const local = new Set(Object.keys((variables as Record<string, unknown>) ?? {}));
      for (const match of String(text).matchAll(/\$\{([^}!]+)\}/g)) {
        const id = match[1]!.split('.')[0]!;
        if (!local.has(id)) found.add(id);
      }
      referencedLogicalIds(variables, found);
    } else referencedLogicalIds(value, found);
  }
  return found;
}

/** The Fn::Sub text of a property with every `${…}` replaced by `<…>`, so the JSON inside parses. */
export function substituteForInspection(value: unknown): string {
  const sub = (value as { 'Fn::Sub'?: unknown })['Fn::Sub'];
  const text = Array.isArray(sub) ? sub[0] : sub;
  if (typeof text !== 'string') throw new Error('not an Fn::Sub');
  return text.replace(/\$\{([^}]+)\}/g, '<$1>');
}

/**
 * The template as JSON text with the one part that differs between two packagings of the same
 * commit replaced: osls names each packaging's artifact folder after the time it ran
 * (`serverless/<service>/<stage>/<epoch ms>-<ISO time>/fenceCheck.zip`). Everything else must
 * match byte for byte.
 */
export function comparableTemplate(template: CfnTemplate): string {
  return JSON.stringify(template, null, 1).replace(
    /("S3Key": "serverless\/[^/]+\/[^/]+\/)\d+-[^/]+(\/)/g,
    '$1<packaged at>$2',
  );
}

/** The zips of two packagings, compared byte for byte: the functions whose zips differ. */
export async function differingArtifacts(a: PackagedService, b: PackagedService): Promise<string[]> {
  const keys = [...new Set([...a.artifacts.keys(), ...b.artifacts.keys()])].sort();
  const differing: string[] = [];
  for (const key of keys) {
    const left = a.artifacts.get(key);
    const right = b.artifacts.get(key);
    if (!left || !right || !(await readFile(left)).equals(await readFile(right))) differing.push(key);
  }
  return differing;
}
