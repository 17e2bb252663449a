/**
 * `explain <runId>`: everything known about one run's cleanup, from the database (the run, its
 * scope's activity and sandbox, whether the scope is blocked, forced clears) and from the
 * dead-letter queues (peeked, never consumed), with a short diagnosis of what to do next.
 */
import type { Command } from '../command.ts';
import { diagnose } from '../diagnosis.ts';
import { describeFailure } from '../failure.ts';
import { renderForcedClears } from '../forced-clears.ts';
import { formatAge, oneLine, orDash, renderTable } from '../format.ts';
import { type RunFacts, type RunSummary, readDeadLettersOf, readRunFacts } from '../run-facts.ts';

export interface Explanation extends RunFacts {
  diagnosis: string[];
}

/** A table, already safe (renderTable makes each cell one line): kept apart from the lines. */
interface Block {
  table: string;
}

function render(explanation: Explanation): string {
  const { run, scope } = explanation;
  const runs = (list: RunSummary[]) =>
    list.length ? list.map((r) => `${r.runId} (${r.status})`).join(', ') : 'none';
  const field = (name: string, value: string) => `  ${name.padEnd(19)}${value}`;
  const sections: Array<string | Block> = [
    `Run ${run.runId}  (${run.runType}, ${run.status})`,
    field('uid / scope', `${run.uid} / ${run.runtimeScopeId}`),
    field('workdir', orDash(run.workdirPath)),
    ...(run.createdByRunId ? [field('created by', run.createdByRunId)] : []),
    field(
      'fence',
      run.fencePending
        ? `PENDING since ${orDash(run.pendingSince)} (${formatAge(run.pendingForSeconds)}); last announced: ${run.lastAnnouncedAt ?? 'never'}`
        : 'clear',
    ),
    field('created / finished', `${orDash(run.createdAt)} / ${orDash(run.finishedAt)}`),
    '',
    'Scope',
    field('blocked', scope.blocked ? 'yes (runtime_cleanup_blocked: no new run is admitted)' : 'no'),
    field(
      'sandbox',
      scope.sandbox
        ? `${scope.sandbox.sandboxId} generation ${scope.sandbox.generation}, ${scope.sandbox.released ? `released at ${scope.sandbox.releasedAt}` : scope.sandbox.releasedAt ? `live (its release mark of ${scope.sandbox.releasedAt} names another generation)` : 'live'}`
        : 'none recorded',
    ),
    ...(scope.deleteInFlight
      ? [
          field(
            'delete in flight',
            `until ${scope.deleteInFlight.until}: sandbox ${orDash(scope.deleteInFlight.sandboxId)} generation ${orDash(scope.deleteInFlight.generation)} (release of run ${orDash(scope.deleteInFlight.runId)})`,
          ),
        ]
      : []),
    field('active runs', runs(scope.activeRuns)),
    field('active descendants', runs(scope.activeDescendants)),
    field('other fences', scope.otherFences.length ? scope.otherFences.join(', ') : 'none'),
    '',
    explanation.forcedClears.length ? 'Forced clears' : 'Forced clears: none',
    ...(explanation.forcedClears.length ? [{ table: renderForcedClears(explanation.forcedClears) }] : []),
    '',
    explanation.deadLettersError
      ? `Dead letters: unknown (${explanation.deadLettersError})`
      : explanation.deadLetters.length
        ? 'Dead letters'
        : 'Dead letters: none',
    ...(explanation.deadLetters.length
      ? [
          {
            table: renderTable(
              ['QUEUE', 'ERROR CODE', 'RECEIVES', 'DEAD-LETTERED AT', 'REASON'],
              explanation.deadLetters.map((letter) => [
                letter.deadLetterQueue,
                orDash(letter.errorCode),
                orDash(letter.receiveCount),
                orDash(letter.deadLetteredAt),
                orDash(letter.reason),
              ]),
            ),
          },
        ]
      : []),
    ...(explanation.deadLettersComplete === false
      ? [`  (the listing may be incomplete: ${explanation.deadLettersIncomplete ?? 'unknown'})`]
      : []),
    '',
    'Diagnosis',
    ...explanation.diagnosis.map((line) => `  - ${line}`),
  ];
  // Every other line holds run ids, reasons and the like from the database: a line break in one
  // must not start a line of its own that looks like part of the report.
  return sections
    .map((section) => (typeof section === 'string' ? oneLine(section) : section.table))
    .join('\n');
}

export const explainCommand: Command = {
  name: 'explain',
  arguments: [{ name: 'runId' }],
  summary: "everything known about one run's cleanup: fence, scope, sandbox, forced clears, dead letters",
  options: {},
  async run(input, context) {
    const runId = input.positionals[0]!;
    const db = await context.database();
    const fromDatabase = await readRunFacts(db, runId);
    let fromQueues: Pick<
      RunFacts,
      'deadLetters' | 'deadLettersComplete' | 'deadLettersIncomplete' | 'deadLettersError'
    >;
    let queueFailure: ReturnType<typeof describeFailure> | undefined;
    try {
      fromQueues = { ...(await readDeadLettersOf(context.queues(), runId)), deadLettersError: null };
    } catch (error) {
      // The database half is still worth showing; the exit code says the picture is incomplete.
      queueFailure = describeFailure(error);
      fromQueues = {
        deadLetters: [],
        deadLettersComplete: null,
        deadLettersIncomplete: null,
        deadLettersError: queueFailure.message,
      };
    }
    const facts = { ...fromDatabase, ...fromQueues };
    const explanation: Explanation = {
      ...facts,
      diagnosis: diagnose(facts, context.config.fenceSweepAfterSeconds),
    };
    return {
      result: explanation,
      text: render(explanation),
      ...(queueFailure
        ? {
            exitCode: queueFailure.exitCode,
            warning: `dead letters could not be read (SQS at ${context.describe.sqs}): ${queueFailure.message}`,
          }
        : {}),
    };
  },
};
