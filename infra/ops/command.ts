/**
 * The shape every command module exports. A command returns its result twice: `result`, the
 * stable JSON shape printed with `--json`, and `text`, the human rendering printed otherwise.
 */
import type { OpsContext } from './context.ts';
import { UsageError } from './errors.ts';
import type { ExitCode } from './exit-codes.ts';

export interface OptionSpec {
  type: 'string' | 'boolean';
  short?: string;
  /** One line for `ops help <command>`; for string options, `value` names the argument. */
  description: string;
  value?: string;
}

export interface CommandInput {
  positionals: string[];
  options: Readonly<Record<string, string | boolean | undefined>>;
}

export interface CommandOutput {
  result: unknown;
  text: string;
  /** Defaults to OK; a command that did part of its work (e.g. committed but could not publish) says so. */
  exitCode?: ExitCode;
  /** One line for stderr alongside a non-zero exit code. */
  warning?: string;
}

export interface Command {
  name: string;
  /** Positional arguments, in order; `optional` ones may be left out. */
  arguments: ReadonlyArray<{ name: string; optional?: boolean }>;
  summary: string;
  /** Extra lines for `ops help <command>`. */
  details?: string;
  options: Readonly<Record<string, OptionSpec>>;
  run(input: CommandInput, context: OpsContext): Promise<CommandOutput>;
}

export function stringOption(input: CommandInput, name: string): string | undefined {
  const value = input.options[name];
  return typeof value === 'string' ? value : undefined;
}

/** A positive integer option with a default and a ceiling (a typo must not fetch a million rows). */
export function limitOption(input: CommandInput, fallback: number, max: number): number {
  const raw = stringOption(input, 'limit');
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!/^\d+$/.test(raw) || value < 1 || value > max) {
    throw new UsageError(`--limit must be an integer from 1 to ${max}, not ${JSON.stringify(raw)}`);
  }
  return value;
}
