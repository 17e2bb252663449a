/**
 * The runs: `concurrency` workers take run indexes in order and play each run's plan (drawn from
 * the seed, the coverage cycle's kind forced on the first runs) to its end.
 */
import { COVERAGE_CYCLE, drawPlan, type FaultKind, type FaultMix, LYING_PROVISIONER_FAULTS } from './plan.ts';
import { runRng } from './random.ts';
import { playRun, type RunContext, type RunRecord } from './run-driver.ts';
import { CHAOS_TIMEOUTS } from './settings.ts';

export async function playAllRuns(input: {
  seed: number;
  runs: number;
  concurrency: number;
  mix: FaultMix;
  coverage: boolean;
  /**
   * Force only these kinds, on every run in turn (a kind-focused run: `--kinds`); without it the
   * coverage cycle forces each kind of the catalogue once, on the first runs.
   */
  focus?: readonly FaultKind[];
  context: RunContext;
  onHarnessError: (message: string) => void;
  /** After each run, with the number done so far. */
  onRunDone: (done: number) => void;
}): Promise<RunRecord[]> {
  const records: RunRecord[] = [];
  let next = 0;
  let done = 0;
  const worker = async () => {
    for (;;) {
      const index = next;
      if (index >= input.runs) return;
      next += 1;
      const rng = runRng(input.seed, index);
      // The coverage cycle forces one kind per run for the first runs only; the rest are random.
      const focus = input.focus && input.focus.length > 0 ? input.focus : undefined;
      const forced = focus ? focus[index % focus.length] : input.coverage ? COVERAGE_CYCLE[index] : undefined;
      const plan = drawPlan(index, rng, input.mix, CHAOS_TIMEOUTS, forced);
      if (plan.provisionerKinds.some((kind) => LYING_PROVISIONER_FAULTS.has(kind))) {
        // A lie leaves the sandbox live with the fence down; a new run or a late duplicate in
        // that scope would then meet a sandbox the protocol was told is gone. Keep lies alone.
        plan.admissionAttemptsAtMs = [];
        plan.replays = [];
        plan.recreateSandbox = null;
      }
      if (plan.quietFleet) {
        // A quiet window is the reclaimer's alone: its own run starts no database episode, admits
        // no run and holds no lock that could fall inside it (invariant Q would measure those).
        plan.terminationStorm = null;
        plan.connectsNeverAnswer = null;
        plan.repeatableRead = null;
        plan.admissionAttemptsAtMs = [];
        plan.locks = [];
        plan.recreateSandbox = null;
      }
      // A quiet window (reclaimer.quiet_fleet) keeps new runs at the door until it is over.
      await input.context.quiet.enter();
      try {
        records.push(await playRun(input.context, plan, rng));
      } catch (error) {
        input.onHarnessError(`run ${index}: ${(error as Error).stack ?? (error as Error).message}`);
      } finally {
        input.context.quiet.leave();
      }
      done += 1;
      input.onRunDone(done);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, input.concurrency) }, worker));
  return records;
}
