/**
 * Setup file of the tiers whose files share a worker (vitest.config.ts: `isolate: false`): what one
 * test file changes in the worker's process environment is undone when the file ends, so the next
 * file in the same worker starts from the environment the worker was given.
 */
import { afterAll } from 'vitest';

// Taken as this file is loaded, before the test file (Vitest loads a setup file again for each
// test file): a change made while the test file is imported is the file's too.
const saved: NodeJS.ProcessEnv = { ...process.env };

afterAll(() => {
  for (const key of Object.keys(process.env)) {
    if (!(key in saved)) delete process.env[key];
  }
  Object.assign(process.env, saved);
});
