/**
 * A packaged function as Lambda's nodejs22.x runtime lays it out (/var/task: the zip's entries, and
 * the AWS SDK v3 the runtime provides, nothing else), and a way to run a script in it under the
 * Node that runs these tests. template.test.ts imports each bundle there; packaged-bundles.test.ts
 * runs the handlers against a real database.
 */
import { mkdir, symlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { type ChildRun, runChild } from './child-process.ts';
import { PROJECT_ROOT, readZip } from './packaged-template.ts';

export const FUNCTION_KEYS = ['fenceCheck', 'release', 'finalize', 'sweeper', 'reclaimer'] as const;
export type FunctionKey = (typeof FUNCTION_KEYS)[number];

/** Each function's handler file inside its zip. */
export const HANDLER_PATHS: Readonly<Record<FunctionKey, string>> = {
  fenceCheck: 'functions/fence-check/handler.mjs',
  release: 'functions/release/handler.mjs',
  finalize: 'functions/finalize/handler.mjs',
  sweeper: 'functions/sweeper/handler.mjs',
  reclaimer: 'functions/reclaimer/handler.mjs',
};

/** Unpacks `zip` into `taskDir` beside a node_modules holding only the runtime's AWS SDK. */
export async function unpackForLambda(zip: string, taskDir: string): Promise<void> {
  for (const [name, data] of await readZip(zip)) {
    await mkdir(dirname(join(taskDir, name)), { recursive: true });
    await writeFile(join(taskDir, name), data);
  }
  await mkdir(join(taskDir, 'node_modules'), { recursive: true });
  await symlink(join(PROJECT_ROOT, 'node_modules', '@aws-sdk'), join(taskDir, 'node_modules', '@aws-sdk'));
}

/** Runs an ES module script with `taskDir` as its working directory and exactly `env`. */
export function runInTask(
  taskDir: string,
  script: string,
  env: Record<string, string>,
  timeoutMs = 60_000,
): Promise<ChildRun> {
  return runChild(process.execPath, ['--input-type=module', '-e', script], { cwd: taskDir, env, timeoutMs });
}

/**
 * A deployed function's environment as a local run gives it: the template's variables, with a plain
 * DATABASE_URL in place of its SSM parameter (read from SSM in packaged-bundles.test.ts) and a
 * provisioner URL, then `overrides`.
 */
export function withPlainDatabaseUrl(
  deployed: Record<string, string>,
  overrides: Record<string, string>,
): Record<string, string> {
  const { DATABASE_URL_PARAMETER: _readFromSsmElsewhere, ...rest } = deployed;
  return {
    PATH: process.env.PATH ?? '',
    AWS_REGION: 'us-east-1',
    ...rest,
    DATABASE_URL: 'postgres://cleanup:secret@db.example.invalid:5432/cleanup',
    SANDBOX_PROVISIONER_URL: 'http://provisioner.example.invalid',
    ...overrides,
  };
}
