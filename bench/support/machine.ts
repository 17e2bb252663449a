/**
 * The machine a run was measured on. Load averages at start and end are part of it: this machine
 * is shared, and a figure taken while others ran their tests is not comparable with a quiet one.
 */
import { cpus, freemem, loadavg, release, totalmem, type } from 'node:os';

export interface MachineDescription {
  cpuModel: string;
  cpuCount: number;
  memoryGiB: number;
  freeMemoryGiBAtStart: number;
  os: string;
  node: string;
  postgres: string;
  postgresSource: string;
  loadAverageAtStart: readonly number[];
  loadAverageAtEnd?: readonly number[];
}

const GIB = 1024 ** 3;
const round2 = (value: number) => Math.round(value * 100) / 100;

export function describeMachine(postgres: { version: string; source: string }): MachineDescription {
  const processors = cpus();
  return {
    cpuModel: processors[0]?.model ?? 'unknown',
    cpuCount: processors.length,
    memoryGiB: round2(totalmem() / GIB),
    freeMemoryGiBAtStart: round2(freemem() / GIB),
    os: `${type()} ${release()}`,
    node: process.version,
    postgres: postgres.version,
    postgresSource: postgres.source,
    loadAverageAtStart: loadavg().map(round2),
  };
}

export function currentLoadAverage(): number[] {
  return loadavg().map(round2);
}
