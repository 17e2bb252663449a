/**
 * What `bench/results/<date>-<mode>.json` holds. Bump `schema` when a field changes meaning.
 * 2: part 1's lease renewals and recovery transactions run in a process of their own (1: on the
 * cleanups' event loop); figures carry `loadProcess`; the extra one-instance split variant; event
 * loop delays exclude the 5 ms sampling interval (1 included it).
 */
import type { E2eReport } from '../e2e/scenario.ts';
import type { LockFigure, LockScenarioProfile, LockVariant } from '../locks/scenario.ts';
import type { BenchProfile } from '../profiles.ts';
import type { ScaleReport } from '../scale/scenario.ts';
import type { MachineDescription } from '../support/machine.ts';

export const RESULTS_SCHEMA = 2 as const;

export interface BenchResults {
  schema: 1 | typeof RESULTS_SCHEMA;
  mode: BenchProfile['mode'];
  startedAt: string;
  finishedAt: string;
  durationSeconds: number;
  machine: MachineDescription;
  /** How the load was modelled, in words, so a reader of the JSON alone can interpret it. */
  model: Record<string, string>;
  locks?: {
    profile: LockScenarioProfile & { deleteLatenciesMs: readonly number[]; rounds: Record<string, number> };
    variants: LockVariant[];
    figures: LockFigure[];
    /** baseline / split with the same pool, and baseline / split with the deployed pool, per delete latency. */
    ratios: LockRatios[];
  };
  e2e?: E2eReport & { profile: BenchProfile['e2e'] };
  scale?: ScaleReport;
  targets: TargetEvaluation[];
  /** False if any figure was invalid (a cleanup did not converge, an error): such figures are not reported. */
  valid: boolean;
}

export interface LockRatios {
  deleteLatencyMs: number;
  /** The split variant the baseline is divided by. */
  versus: string;
  leaseRenewalP99: number | undefined;
  recoveryTransactionP99: number | undefined;
  advisoryHoldP99: number | undefined;
  rowHoldP99: number | undefined;
  cleanupsPerSecond: number | undefined;
}

export interface TargetEvaluation {
  id: string;
  target: string;
  measured: string;
  met: boolean | undefined;
  /** How far off, when missed. */
  missedBy?: string;
}

export function lockFigure(
  figures: readonly LockFigure[],
  variant: string,
  deleteLatencyMs: number,
): LockFigure | undefined {
  return figures.find((f) => f.variant === variant && f.deleteLatencyMs === deleteLatencyMs && f.valid);
}
