import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/global-setup.ts'],
    pool: 'forks',
    // Two cores: more workers only add contention to timing-sensitive lock tests.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 120_000,
    reporters: ['default'],
    // EMF lines of every handler would flood the test output; tests about metrics turn them on.
    env: { POWERTOOLS_METRICS_DISABLED: 'true', NODE_OPTIONS: '--disable-warning=ExperimentalWarning' },
  },
});
