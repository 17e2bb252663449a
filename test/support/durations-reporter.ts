/**
 * Records how long each long test file took (its hooks included: a chaos engine runs in its
 * beforeAll) into file-durations.json, which the sequencer schedules by (sequencer.ts). Run it on a
 * merged run, on the machine CI uses:
 *
 *   RUNTIME_CLEANUP_TEST_PASSES=all npx vitest run --project '!platform' \
 *     --reporter=default --reporter=./test/support/durations-reporter.ts
 *
 * A file runs once per database pass: the longest of its runs is kept. Files under a second are
 * left out (the sequencer assumes two seconds for a file it has no record of); files this run did
 * not run keep what was recorded before.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { relative } from 'node:path';
import type { Reporter, TestModule } from 'vitest/node';

const OUTPUT = new URL('./file-durations.json', import.meta.url);
const RECORDED_FROM_SECONDS = 1;

export default class DurationsReporter implements Reporter {
  readonly #seconds = new Map<string, number>();
  #root = process.cwd();

  onInit(vitest: { config: { root: string } }): void {
    this.#root = vitest.config.root;
  }

  onTestModuleEnd(module: TestModule): void {
    const path = relative(this.#root, module.moduleId);
    const seconds = module.diagnostic().duration / 1000;
    this.#seconds.set(path, Math.max(this.#seconds.get(path) ?? 0, seconds));
  }

  onTestRunEnd(): void {
    const before = JSON.parse(readFileSync(OUTPUT, 'utf8')) as { seconds: Record<string, number> };
    for (const [path, value] of Object.entries(before.seconds)) {
      if (!this.#seconds.has(path)) this.#seconds.set(path, value);
    }
    const seconds = Object.fromEntries(
      [...this.#seconds]
        .filter(([, value]) => value >= RECORDED_FROM_SECONDS)
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([path, value]) => [path, Math.round(value * 10) / 10]),
    );
    writeFileSync(
      OUTPUT,
      `${JSON.stringify({ recorded: new Date().toISOString().slice(0, 10), seconds }, null, 2)}\n`,
    );
  }
}
