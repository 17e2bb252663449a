/**
 * Seeded randomness for the chaos suite. Every decision the suite makes (which faults a run gets,
 * when they fire, which backend is terminated) is drawn from a stream derived from the seed, so a
 * seed reproduces the fault plan. The interleaving of the real processes is not reproducible —
 * that is the point of running them for real — but the plan that provoked a violation is, and it
 * is printed with the violation.
 */
import { seededRandom } from '../../infra/local/provisioner/faults.ts';

export class Rng {
  readonly #next: () => number;

  constructor(seed: number) {
    this.#next = seededRandom(seed);
  }

  /** A uniform number in [0, 1). */
  next(): number {
    return this.#next();
  }

  chance(probability: number): boolean {
    return this.#next() < probability;
  }

  /** An integer in [min, max], both included. */
  int(min: number, max: number): number {
    return min + Math.floor(this.#next() * (max - min + 1));
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error('pick from an empty list');
    return items[Math.floor(this.#next() * items.length)]!;
  }

  /** A new, independent stream: `derive(i)` gives run i the same plan whatever ran before it. */
  derive(label: number): Rng {
    return new Rng(mixSeed(Math.floor(this.#next() * 2 ** 32), label));
  }
}

/** Combines a seed and a label into a new 32-bit seed (an integer hash, good enough for streams). */
export function mixSeed(seed: number, label: number): number {
  let h = (seed ^ 0x9e3779b9) >>> 0;
  h = Math.imul(h ^ (label + 0x7f4a7c15), 0x85ebca6b) >>> 0;
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}

/** Run i's stream: independent of scheduling, so run i always gets the same plan for a seed. */
export function runRng(seed: number, runIndex: number): Rng {
  return new Rng(mixSeed(seed, runIndex + 1));
}
