/**
 * The "what now" of `explain`: a few plain sentences from the facts, each naming the command that
 * helps. The order follows the protocol: a run still active, a scope still busy, a dead letter, a
 * fence merely waiting for its next announcement.
 */
import { RunType } from '../../functions/cleanup/types.ts';
import { formatAge, orDash, plural } from './format.ts';
import type { RunFacts } from './run-facts.ts';

/** Dead-letter reasons no retry can fix: the data or the provisioner must be looked at first. */
const PERMANENT_DEAD_LETTER_CODES = new Set([
  'GENERATION_ANOMALY',
  'OWNERSHIP_CONFLICT',
  'PROVISIONER_REJECTED',
  'PROVISIONER_BAD_RESPONSE',
  // A 200 that is not the provisioner's answer: SANDBOX_PROVISIONER_URL names something else.
  'PROVISIONER_UNCONFIRMED',
]);

export function diagnose(facts: RunFacts, sweepAfterSeconds: number): string[] {
  const { run, scope, forcedClears, deadLetters } = facts;
  const lines: string[] = [];
  const retry = `npm run ops -- retry ${run.runId}`;
  if (run.runType === RunType.SUBAGENT) {
    lines.push(`a subagent run owns no cleanup; its root run is ${orDash(run.createdByRunId)}`);
  } else if (run.fencePending) {
    const waitingFor = [...scope.activeRuns, ...scope.activeDescendants].map(
      (r) => `${r.runId} (${r.status})`,
    );
    if (!run.terminal) {
      lines.push(`the run is still ${run.status}: its cleanup starts when it ends`);
    } else if (waitingFor.length) {
      lines.push(`cleanup is deferred until these runs end: ${waitingFor.join(', ')}`);
    }
    const latest = deadLetters.at(-1);
    if (latest) {
      lines.push(
        `${plural(deadLetters.length, 'dead letter')} for this run; latest ${orDash(latest.errorCode)} on ${latest.sourceQueue}: ${orDash(latest.reason)}`,
      );
      lines.push(
        latest.errorCode !== null && PERMANENT_DEAD_LETTER_CODES.has(latest.errorCode)
          ? `no retry can fix ${latest.errorCode}: check the sandbox at the provisioner; if it must be given up, npm run ops -- force-clear ${run.runId} --reason "<why>"`
          : `once the cause is fixed: npm run ops -- redrive ${latest.sourceQueue}  (or: ${retry})`,
      );
    } else if (run.terminal && !waitingFor.length) {
      lines.push(
        `fence pending for ${formatAge(run.pendingForSeconds)}, last announced ${run.lastAnnouncedAt ?? 'never by the sweeper'}; the sweeper announces it again after ${sweepAfterSeconds} s, or now: ${retry}`,
      );
    }
  } else {
    const forced = forcedClears[0];
    if (forced) {
      lines.push(`fence force-cleared by ${forced.actor} at ${forced.forcedAt}: ${forced.reason}`);
      if (forced.sandboxId !== null) {
        lines.push(
          `sandbox ${forced.sandboxId} generation ${forced.generation} was not confirmed deleted: it stays recorded as live, and the scope's next cleanup deletes it`,
        );
      }
    } else {
      lines.push('no cleanup pending for this run');
    }
    if (deadLetters.length) {
      // Redriving is harmless: the release guard finds the fence gone and sends no DELETE.
      lines.push(
        `${plural(deadLetters.length, 'stale dead letter')} for this run: its fence is clear, so a redriven release of it sends nothing`,
      );
    }
  }
  if (scope.deleteInFlight) {
    lines.push(
      `a DELETE of sandbox ${orDash(scope.deleteInFlight.sandboxId)} generation ${orDash(scope.deleteInFlight.generation)} may still act at the provisioner until ${scope.deleteInFlight.until}: the scope admits no run and force-clear refuses (exit 4) until then, unless the release ends it sooner`,
    );
  }
  if (scope.otherFences.length) {
    lines.push(`the scope is also fenced by: ${scope.otherFences.join(', ')}`);
  }
  return lines;
}
