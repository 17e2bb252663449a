/**
 * Two clocks meet in the invariants: the provisioner's audit (this process,
 * `performance.timeOrigin + performance.now()`, monotonic from process start) and the ledger
 * (PostgreSQL's `clock_timestamp()`, the wall clock). They are related in two steps:
 *
 * - wall − performance, read in-process (`Date.now()` against `performance.now()`): no round trip,
 *   error under a millisecond, re-read often because the wall clock may be slewed;
 * - database − wall, from round trips to PostgreSQL: on a busy event loop a round trip can take
 *   tens of milliseconds, so only the sample with the shortest round trip is used (its error is at
 *   most half of it). On one machine both read the same clock and this is ~0; it matters only
 *   for a remote DATABASE_URL.
 */
import type { Executor } from '../../functions/adapters/database.ts';

export function preciseNow(): number {
  return performance.timeOrigin + performance.now();
}

interface WallSample {
  atMs: number;
  wallMinusPerformanceMs: number;
}

interface DatabaseSample {
  databaseMinusWallMs: number;
  roundTripMs: number;
}

const DATABASE_NOW = 'SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now_ms';

export class ClockSync {
  readonly #wall: WallSample[] = [];
  #best: DatabaseSample | undefined;
  #databaseSamples = 0;

  constructor(private readonly db: Executor) {}

  /** One wall/performance reading, and three database round trips (the shortest may replace the best). */
  async sample(): Promise<void> {
    this.sampleWall();
    for (let i = 0; i < 3; i += 1) {
      const before = performance.now();
      const wallBefore = Date.now();
      const { rows } = await this.db.query<{ now_ms: number }>(DATABASE_NOW);
      const roundTripMs = performance.now() - before;
      const wallMiddle = wallBefore + roundTripMs / 2;
      const sample = { databaseMinusWallMs: rows[0]!.now_ms - wallMiddle, roundTripMs };
      this.#databaseSamples += 1;
      if (!this.#best || sample.roundTripMs < this.#best.roundTripMs) this.#best = sample;
    }
  }

  sampleWall(): void {
    const performanceNow = preciseNow();
    this.#wall.push({ atMs: performanceNow, wallMinusPerformanceMs: Date.now() - performanceNow });
  }

  /** A database epoch-ms time on this process's timeline. */
  toLocal(databaseMs: number): number {
    const wallMs = databaseMs - (this.#best?.databaseMinusWallMs ?? 0);
    return wallMs - this.#wallOffsetNear(wallMs);
  }

  summary(): Record<string, number> {
    const offsets = this.#wall.map((s) => s.wallMinusPerformanceMs);
    return {
      databaseSamples: this.#databaseSamples,
      databaseMinusWallMs: this.#best?.databaseMinusWallMs ?? 0,
      databaseOffsetErrorBoundMs: (this.#best?.roundTripMs ?? 0) / 2,
      wallSamples: offsets.length,
      wallMinusPerformanceDriftMs: offsets.length ? Math.max(...offsets) - Math.min(...offsets) : 0,
    };
  }

  #wallOffsetNear(atMs: number): number {
    let nearest: WallSample | undefined;
    for (const sample of this.#wall) {
      if (!nearest || Math.abs(sample.atMs - atMs) < Math.abs(nearest.atMs - atMs)) nearest = sample;
    }
    return nearest?.wallMinusPerformanceMs ?? Date.now() - preciseNow();
  }
}
