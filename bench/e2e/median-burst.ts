/**
 * The burst with the median cleanups/s: the figure that stands for a design when it ran several
 * bursts. Its other figures (CPU, round trips) are that burst's own, so a row never mixes two
 * bursts. The count must be odd: of an even count either middle one would favour one side of a
 * project ÷ floor ratio.
 */
export function medianBurst<Burst extends { cleanupsPerSecond: number }>(bursts: readonly Burst[]): Burst {
  if (bursts.length === 0) throw new Error('no burst to take the median of');
  if (bursts.length % 2 === 0)
    throw new Error(`an odd number of bursts is needed for a median burst, not ${bursts.length}`);
  const sorted = [...bursts].sort((a, b) => a.cleanupsPerSecond - b.cleanupsPerSecond);
  return sorted[Math.floor((sorted.length - 1) / 2)]!;
}
