/**
 * What `bench/results/<date>-<mode>.json` holds. Bump `schema` when a field changes meaning.
 * 2: part 1's lease renewals and recovery transactions run in a process of their own (1: on the
 * cleanups' event loop); figures carry `loadProcess`; the extra one-instance split variant; event
 * loop delays exclude the 5 ms sampling interval (1 included it).
 */
import type { E2eReport } from '../e2e/scenario.ts';
import {
  Design,
  type LockFigure,
  type LockScenarioProfile,
  type LockVariant,
  VariantId,
} from '../locks/scenario.ts';
import type { BenchProfile } from '../profiles.ts';
import type { ScaleReport } from '../scale/scenario.ts';
import type { MachineDescription } from '../support/machine.ts';
import { ratio } from '../support/stats.ts';

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

/**
 * Part 1's deployed split against the floor's row at one delete latency: each one's lock hold p99
 * on the server, and split ÷ floor. Server hold over server hold only, never a client round trip
 * (which adds the trip back and this process's event loop). Undefined when the run had no floor row.
 */
export function splitOverFloorHold(
  locks: NonNullable<BenchResults['locks']>,
  deleteLatencyMs: number,
): { floor: LockVariant; floorP99?: number; splitP99?: number; ratio?: number } | undefined {
  const floor = locks.variants.find((v) => v.design === Design.FLOOR);
  if (!floor) return undefined;
  const floorP99 = lockFigure(locks.figures, floor.id, deleteLatencyMs)?.serverHoldMs?.p99;
  const splitP99 = lockFigure(locks.figures, VariantId.SPLIT_DEPLOYED_POOL, deleteLatencyMs)?.serverHoldMs
    ?.p99;
  const splitOverFloor = ratio(splitP99, floorP99);
  return {
    floor,
    ...(floorP99 === undefined ? {} : { floorP99 }),
    ...(splitP99 === undefined ? {} : { splitP99 }),
    ...(splitOverFloor === undefined ? {} : { ratio: splitOverFloor }),
  };
}
