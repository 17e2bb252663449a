/**
 * The chaos report, as JSON (every figure, every violation with its details) and as Markdown (the
 * figures a reader wants first). Written under test/chaos/results/ by the CLI and the fixed-seed
 * test.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { ChaosResult } from './result.ts';

export function reportBaseName(result: Pick<ChaosResult, 'seed' | 'runs'>): string {
  return `chaos-seed${result.seed}-runs${result.runs}`;
}

const ms = (value: number) => `${(value / 1000).toFixed(2)} s`;

export function renderMarkdown(result: ChaosResult): string {
  const lines: string[] = [];
  const total = result.violations.length;
  lines.push(`# Chaos report — seed ${result.seed}, ${result.runs} runs`);
  lines.push('');
  lines.push(
    `**${total === 0 ? 'No invariant violated' : `${total} VIOLATION(S)`}** · ${result.runs} runs, ${result.concurrency} concurrent · total ${ms(result.durationMs)} (runs ${ms(result.runPhaseMs)}, final drain ${ms(result.finalDrainMs)}) · started ${result.startedAt}`,
  );
  lines.push('');
  lines.push(
    `Reproduce: \`npm run chaos -- --seed ${result.seed} --runs ${result.runs} --concurrency ${result.concurrency}${result.config.coverage ? ' --coverage' : ''}${Array.isArray(result.config.focus) ? ` --kinds ${result.config.focus.join(',')}` : ''}\` (the fault plan of every run is reproducible from the seed; the interleaving of real processes is not).`,
  );
  lines.push('');
  lines.push('## Invariants');
  lines.push('');
  lines.push('| invariant | checks | violations |');
  lines.push('|---|---:|---:|');
  for (const [name, { checked, violations }] of Object.entries(result.checks)) {
    lines.push(`| ${name} | ${checked} | ${violations} |`);
  }
  lines.push('');
  lines.push(`Violations seen by the periodic checks while runs executed: ${result.foundDuringRun}.`);
  lines.push('');
  lines.push('## Convergence once faults stop');
  lines.push('');
  const c = result.convergence;
  lines.push(
    `Per root run, from the later of (fence set, its faults lifted, its scope's last run terminal) to the fence's clear. Stated bound: **${ms(c.boundMs)}** (derivation in test/chaos/settings.ts, \`CONVERGENCE_BOUND_MS\`).`,
  );
  lines.push('');
  lines.push('| measure | samples | p50 | p99 | max |');
  lines.push('|---|---:|---:|---:|---:|');
  lines.push(
    `| convergence after faults stop, every root run (0 when it cleared while faults still fired) | ${c.samples} | ${ms(c.p50Ms)} | ${ms(c.p99Ms)} | ${ms(c.maxMs)} |`,
  );
  const f = c.fencedWhenFaultsStopped;
  lines.push(
    `| convergence after faults stop, fences still up when they stopped | ${f.samples} | ${ms(f.p50Ms)} | ${ms(f.p99Ms)} | ${ms(f.maxMs)} |`,
  );
  lines.push(
    `| fence set → clear (faults included) | ${c.samples} | ${ms(c.fenceToClearP50Ms)} | ${ms(c.fenceToClearP99Ms)} | ${ms(c.fenceToClearMaxMs)} |`,
  );
  lines.push('');
  lines.push(
    `Final drain (every fault stopped → no fence, empty queues, every message acknowledged): ${ms(result.finalDrainMs)}.`,
  );
  lines.push('');
  lines.push('## Faults injected');
  lines.push('');
  lines.push('| fault | count |');
  lines.push('|---|---:|');
  for (const [kind, count] of Object.entries(result.faultsInjected)) lines.push(`| ${kind} | ${count} |`);
  lines.push('');
  const forcedRuns =
    Object.values(result.coverage.fired).reduce((sum, n) => sum + n, 0) + result.coverage.missed.length;
  if (forcedRuns > 0) {
    lines.push(
      `Coverage cycle: ${forcedRuns} forced runs, ${result.coverage.missed.length} whose kind did not fire${result.coverage.missed.length ? ` (${result.coverage.missed.map((m) => `${m.kind} in run ${m.run}`).join(', ')})` : ''}; the longest wait past a window for a forced fault was ${ms(result.coverage.longestWaitMs)}.`,
    );
    lines.push('');
  }
  lines.push('Backends terminated, by what they were doing:');
  lines.push('');
  for (const [phase, count] of Object.entries(result.dbKillsByPhase)) lines.push(`- ${phase}: ${count}`);
  lines.push('');
  lines.push('## Probe (invariant 3), dead letters, messages');
  lines.push('');
  lines.push(`- probe verdicts: ${JSON.stringify(result.probe)}`);
  lines.push(`- dead letters by queue and error code: ${JSON.stringify(result.deadLetters)}`);
  lines.push(`- messages: ${JSON.stringify(result.messages)}`);
  lines.push(`- admission attempts during cleanup: ${JSON.stringify(result.admissions)}`);
  lines.push(`- sandboxes: ${JSON.stringify(result.sandboxes)}`);
  lines.push(`- clock alignment (database ↔ this process): ${JSON.stringify(result.clock)}`);
  lines.push(`- event-source errors seen: ${JSON.stringify(result.stackErrors)}`);
  if (result.episodes)
    lines.push(`- issue 11 episodes and operator actions: ${JSON.stringify(result.episodes)}`);
  lines.push(`- harness errors: ${result.harnessErrors.length}`);
  if (result.security) lines.push(`- static security checks: ${JSON.stringify(result.security)}`);
  lines.push('');
  if (total > 0) {
    lines.push('## Violations');
    lines.push('');
    for (const violation of result.violations.slice(0, 50)) {
      lines.push(`- **${violation.invariant}** — ${violation.message}`);
    }
    lines.push('');
  }
  lines.push('## Machine and configuration');
  lines.push('');
  lines.push('```json');
  lines.push(JSON.stringify({ machine: result.machine, config: result.config }, null, 2));
  lines.push('```');
  lines.push('');
  return lines.join('\n');
}

export async function writeReport(result: ChaosResult, dir: string, baseName = reportBaseName(result)) {
  await mkdir(dir, { recursive: true });
  const json = join(dir, `${baseName}.json`);
  const markdown = join(dir, `${baseName}.md`);
  await writeFile(json, `${JSON.stringify(result, null, 2)}\n`);
  await writeFile(markdown, renderMarkdown(result));
  return { json, markdown };
}
