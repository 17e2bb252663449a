/**
 * The run statuses as lists, for the tools that must name them: the demo's workload and report,
 * the local platform simulator, the chaos plans and the tests. The terminal ones are READ from their
 * one definition, `runtime_cleanup_status_is_active` (infra/sql/), never written here: the deployed
 * functions need no list at all (they ask the database), and a second spelling is how the copies
 * once drifted. Node-only (it reads the file at import): nothing under functions/ may import it.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const DEFINITION = fileURLToPath(new URL('./sql/runtime_cleanup_status_is_active.sql', import.meta.url));

/** The quoted statuses of the definition's `status NOT IN (…)`, comments aside. */
export function terminalStatusesIn(definition: string): string[] {
  const list = /status\s+NOT\s+IN\s*\(([^)]*)\)/i.exec(definition.replace(/--[^\n]*/g, ''))?.[1];
  const statuses = list === undefined ? [] : [...list.matchAll(/'([^']*)'/g)].map((match) => match[1]!);
  if (statuses.length === 0) {
    throw new Error(
      `no "status NOT IN ('…')" list in ${DEFINITION}: the terminal statuses are read from there`,
    );
  }
  return statuses;
}

export const TERMINAL_RUN_STATUSES: readonly string[] = Object.freeze(
  terminalStatusesIn(readFileSync(DEFINITION, 'utf8')),
);

/** Statuses a platform uses for runs still going (examples: anything not terminal is active). */
export const NON_TERMINAL_RUN_STATUSES = ['pending', 'running', 'cancel_requested'] as const;
