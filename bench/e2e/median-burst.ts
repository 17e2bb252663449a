/**
 * The burst with the median cleanups/s (the lower middle one of an even count): the figure that
 * stands for a design when it ran several bursts. Its other figures (CPU, round trips) are that
 * burst's own, so a row never mixes two bursts.
 */
export function medianBurst<Burst extends { cleanupsPerSecond: number }>(bursts: readonly Burst[]): Burst {
  if (bursts.length === 0) throw new Error('no burst to take the median of');
  const sorted = [...bursts].sort((a, b) => a.cleanupsPerSecond - b.cleanupsPerSecond);
  return sorted[Math.floor((sorted.length - 1) / 2)]!;
}
