/**
 * The command line of `npm run chaos`, parsed and validated once: every problem is one line
 * naming the option and the rule (exit status 2), `--help` prints the usage (exit status 0).
 */
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { FaultKind } from './plan.ts';
import { RECLAIM_CHAOS_ENV } from './reclaim-chaos.ts';

export interface ChaosCommandLine {
  seed: number;
  runs: number;
  concurrency: number;
  coverage: boolean;
  /** `--kinds a,b`: force only these kinds, on every run in turn. */
  kinds: FaultKind[];
  out: string;
  keepDb: boolean;
  /** `--reclaim-grace N`: the reclaimer's grace in seconds (RECLAIM_GRACE_SECONDS). */
  reclaimGraceSeconds: number;
  /** `--reclaim-max-share N`: RECLAIM_MAX_SHARE_PERCENT; the product's default when absent. */
  reclaimMaxSharePercent: number | undefined;
}

export type ParsedChaosCommandLine =
  | { kind: 'run'; options: ChaosCommandLine }
  | { kind: 'help' }
  | { kind: 'invalid'; message: string };

export const ChaosExitCode = {
  /** Every invariant held and the harness ran clean. */
  OK: 0,
  /** An invariant was violated, or the harness itself failed. */
  FAILED: 1,
  /** Bad options: nothing was run. */
  USAGE: 2,
} as const;

const RESULTS_DIR = fileURLToPath(new URL('./results/', import.meta.url));

export const CHAOS_DEFAULTS = { seed: 20261130, runs: 200, concurrency: 32 } as const;
/** The reclaimer's grace under chaos (RECLAIM_CHAOS_ENV): leaks go seconds after they leak. */
export const CHAOS_RECLAIM_GRACE_SECONDS = Number(RECLAIM_CHAOS_ENV.RECLAIM_GRACE_SECONDS);

export const CHAOS_HELP = `npm run chaos -- [options]

Runs the chaos suite: many root-run lifecycles at once on the local stack (real PostgreSQL,
the SQS emulator, the local provisioner, the real functions) while faults from a seeded plan
are injected, checking the invariants during and after every run. Writes a report (JSON and
Markdown) and exits 1 if any invariant was violated.

Options
  --seed N          seed of the fault plan (non-negative integer)          (default ${CHAOS_DEFAULTS.seed})
  --runs N          root-run lifecycles in total (positive integer)        (default ${CHAOS_DEFAULTS.runs})
  --concurrency N   lifecycles at a time (positive integer)                (default ${CHAOS_DEFAULTS.concurrency})
  --coverage        force one fault kind per run first, so that a small
                    run covers the whole catalogue
  --kinds K[,K…]    force only these fault kinds, one per run in turn, on
                    every run (a kind-focused run, e.g. to show the suite
                    finds a fault with its fix reverted); names as in the
                    report's "Faults injected" table
  --out DIR         where the report goes                                  (default test/chaos/results/)
  --reclaim-grace N the reclaimer's grace in seconds (positive integer); one
                    longer than the reclaim guard's hold (14.5 s) lets the
                    tombstone's refusal by generation outlast the in-flight
                    record, which invariants K and N then see on their own   (default ${CHAOS_RECLAIM_GRACE_SECONDS})
  --reclaim-max-share N
                    RECLAIM_MAX_SHARE_PERCENT (1-100): 100 turns the brakes
                    off, for a kind-focused run whose few runs never make
                    a healthy listing to pair on                           (default: the product's)
  --keep-db         keep the run's database for a post-mortem
  -h, --help        this text

Environment
  DATABASE_URL      a PostgreSQL whose cluster may get a fresh database for the run; unset, an
                    embedded PostgreSQL is started (and stopped at the end)

Exit status
  0  no invariant violated, the harness ran clean
  1  a violation, or the harness failed (the report names it)
  2  bad options: nothing was run
`;

export function parseChaosCommandLine(argv: readonly string[]): ParsedChaosCommandLine {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: {
        seed: { type: 'string' },
        runs: { type: 'string' },
        concurrency: { type: 'string' },
        coverage: { type: 'boolean' },
        kinds: { type: 'string' },
        out: { type: 'string' },
        'keep-db': { type: 'boolean' },
        'reclaim-grace': { type: 'string' },
        'reclaim-max-share': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    return { kind: 'invalid', message: `${(error as Error).message}; see: npm run chaos -- --help` };
  }
  if (values.help) return { kind: 'help' };
  const defaults = {
    ...CHAOS_DEFAULTS,
    'reclaim-grace': CHAOS_RECLAIM_GRACE_SECONDS,
    'reclaim-max-share': 0,
  };
  const integer = (name: keyof typeof defaults, minimum: 0 | 1): number | string => {
    const raw = values[name];
    if (raw === undefined) return defaults[name];
    const value = Number(raw);
    if (typeof raw === 'string' && /^\d+$/.test(raw) && Number.isSafeInteger(value) && value >= minimum) {
      return value;
    }
    return `--${name} ${JSON.stringify(raw)} is invalid: must be a ${minimum === 0 ? 'non-negative' : 'positive'} integer`;
  };
  const seed = integer('seed', 0);
  const runs = integer('runs', 1);
  const concurrency = integer('concurrency', 1);
  const reclaimGrace = integer('reclaim-grace', 1);
  const maxShare = integer('reclaim-max-share', 1);
  for (const checked of [seed, runs, concurrency, reclaimGrace, maxShare]) {
    if (typeof checked === 'string') return { kind: 'invalid', message: checked };
  }
  if ((maxShare as number) > 100) {
    return { kind: 'invalid', message: `--reclaim-max-share ${maxShare} is invalid: at most 100` };
  }
  const known = new Set<string>(Object.values(FaultKind));
  const kinds = typeof values.kinds === 'string' ? values.kinds.split(',').map((kind) => kind.trim()) : [];
  const unknown = kinds.filter((kind) => !known.has(kind));
  if (unknown.length > 0 || (typeof values.kinds === 'string' && kinds.length === 0)) {
    return {
      kind: 'invalid',
      message: `--kinds ${JSON.stringify(values.kinds)} is invalid: unknown kind(s) ${unknown.map((kind) => JSON.stringify(kind)).join(', ')}; known: ${[...known].join(', ')}`,
    };
  }
  return {
    kind: 'run',
    options: {
      seed: seed as number,
      runs: runs as number,
      concurrency: concurrency as number,
      coverage: values.coverage === true,
      kinds: kinds as FaultKind[],
      out: typeof values.out === 'string' ? values.out : RESULTS_DIR,
      keepDb: values['keep-db'] === true,
      reclaimGraceSeconds: reclaimGrace as number,
      reclaimMaxSharePercent: values['reclaim-max-share'] === undefined ? undefined : (maxShare as number),
    },
  };
}
