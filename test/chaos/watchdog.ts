/**
 * A chaos run inside Vitest that outlives its hook's bound fails as "Hook timed out", naming no
 * step. This watchdog keeps the engine's last stage and progress, and once the run is overdue it
 * writes them to the process's stderr with the kinds of handle the process still waits on, so a
 * hang names where it is.
 */
import { writeSync } from 'node:fs';

export interface ChaosWatchdog {
  onStage(stage: string): void;
  onProgress(progress: { done: number; total: number; violations: number; elapsedMs: number }): void;
  stop(): void;
}

export function startChaosWatchdog(name: string, overdueMs: number): ChaosWatchdog {
  const started = Date.now();
  let stage = 'starting: database, stack, harness pools';
  let stageAt = started;
  let progress = 'no run done yet';
  const timer = setTimeout(() => {
    const resources = new Map<string, number>();
    for (const kind of process.getActiveResourcesInfo()) resources.set(kind, (resources.get(kind) ?? 0) + 1);
    const line = JSON.stringify({
      chaosWatchdog: name,
      overdueAfterMs: overdueMs,
      lastStage: stage,
      lastStageSinceMs: Date.now() - stageAt,
      progress,
      activeResources: Object.fromEntries(resources),
    });
    // Straight to the file descriptor: the test may have replaced process.stderr.write.
    writeSync(2, `\n${line}\n`);
  }, overdueMs);
  timer.unref();
  return {
    onStage(next) {
      stage = next;
      stageAt = Date.now();
    },
    onProgress({ done, total, violations, elapsedMs }) {
      progress = `${done}/${total} runs done after ${Math.round(elapsedMs)} ms, ${violations} violations`;
      if (done === total) {
        stage = 'runs done: waiting for the first backend termination (coverage)';
        stageAt = Date.now();
      }
    },
    stop: () => clearTimeout(timer),
  };
}
