import { describe, expect, it } from 'vitest';
import { CHAOS_DEFAULTS, parseChaosCommandLine } from '../chaos/cli-options.ts';

describe('the command line of npm run chaos', () => {
  it('takes the defaults, and every option', () => {
    expect(parseChaosCommandLine([])).toMatchObject({ kind: 'run', options: { ...CHAOS_DEFAULTS } });
    expect(
      parseChaosCommandLine(['--seed', '0', '--runs', '5', '--concurrency', '2', '--coverage', '--keep-db']),
    ).toMatchObject({
      kind: 'run',
      options: { seed: 0, runs: 5, concurrency: 2, coverage: true, keepDb: true },
    });
  });

  it('answers --help and -h with the usage', () => {
    expect(parseChaosCommandLine(['--help'])).toEqual({ kind: 'help' });
    expect(parseChaosCommandLine(['-h'])).toEqual({ kind: 'help' });
  });

  it('refuses unknown options, stray arguments and values that are not whole numbers in range', () => {
    for (const argv of [
      ['--bogus'],
      ['200'],
      ['--runs', '0'],
      ['--runs', '1.5'],
      ['--seed', '-1'],
      ['--concurrency', 'x'],
    ]) {
      const parsed = parseChaosCommandLine(argv);
      expect(parsed.kind, argv.join(' ')).toBe('invalid');
    }
  });
});

describe('npm run chaos -- --kinds', () => {
  it('takes known fault kinds, comma-separated', () => {
    const parsed = parseChaosCommandLine([
      '--kinds',
      'provisioner.410_gone, input.forged_or_mismatched_release',
    ]);
    expect(parsed).toMatchObject({
      kind: 'run',
      options: { kinds: ['provisioner.410_gone', 'input.forged_or_mismatched_release'] },
    });
  });

  it('refuses an unknown kind, naming it', () => {
    const parsed = parseChaosCommandLine(['--kinds', 'provisioner.410_gone,provisioner.teapot']);
    expect(parsed.kind).toBe('invalid');
    if (parsed.kind === 'invalid') expect(parsed.message).toContain('"provisioner.teapot"');
  });
});
