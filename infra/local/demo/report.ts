import { TERMINAL_RUN_STATUSES } from '../../run-statuses.ts';
import { DemoOutcome, type DemoSummary } from './summary.ts';

/** What each error code of a failed attempt means, in the words of the fault that caused it. */
const FAILURE_MEANING: Record<string, string> = {
  PROVISIONER_UNAVAILABLE: '5xx answer',
  PROVISIONER_THROTTLED: '429 answer (too many requests)',
  PROVISIONER_DELETE_TIMEOUT: 'hung until the delete timeout',
  CLEANUP_TIMEOUT: 'hung until the release deadline',
  PROVISIONER_CONNECTION: 'connection reset, twice',
  RELEASE_LOCK_TIMEOUT: "provider's lock not had in time",
  DATABASE_UNAVAILABLE: 'database connection lost',
  DATABASE_LOCK_TIMEOUT: 'database lock timeout',
  QUEUE_UNAVAILABLE: 'SQS call failed',
};

/** The summary as a person reads it at the end of `npm start`. */
export function renderSummary(s: DemoSummary, options: { color: boolean }): string {
  const paint = (code: number, text: string) => (options.color ? `\x1b[${code}m${text}\x1b[39m` : text);
  const mark = (ok: boolean) => (ok ? paint(32, '✓') : paint(31, '✗'));
  const left = leftBehind(s);
  // Nothing ran (the stack could not start, or Ctrl-C came first): the figures would all be zero.
  if (s.outcome === DemoOutcome.FAILED && s.runs.root === 0) {
    return `\n${mark(false)} Could not start: ${s.reasons.join('; ')}. Exit ${s.exitCode}.\n`;
  }
  if (s.outcome === DemoOutcome.INTERRUPTED && s.runs.root === 0) {
    return `\nInterrupted before any run started; stopped: ${left}. Exit ${s.exitCode}.\n`;
  }
  const lines: string[] = ['', 'Summary'];
  const add = (label: string, text: string) => lines.push(`  ${label.padEnd(14)}${text}`);
  const more = (text: string) => lines.push(`${' '.repeat(16)}${text}`);
  const interrupted = s.outcome === DemoOutcome.INTERRUPTED;

  const statuses = TERMINAL_RUN_STATUSES.map((status) => `${s.runs.byStatus[status] ?? 0} ${status}`).join(
    ', ',
  );
  add(
    'runs',
    `${s.runs.root} root runs (+${s.runs.subagents} subagents) in ${s.runs.scopes} conversations: ${statuses}`,
  );
  add(
    'fences',
    interrupted
      ? `${s.fences.set} set, ${s.fences.clearedPerLog} cleared before the stop`
      : `${s.fences.set} set, ${s.fences.clearedPerLog} cleared, ${Math.max(0, s.fences.pendingInDatabase)} pending`,
  );
  if (!interrupted && s.sandboxes.liveAtProvisioner >= 0) {
    add(
      'sandboxes',
      s.sandboxes.processesChecked
        ? `${s.sandboxes.acquired} acquired; ${s.sandboxes.liveAtProvisioner} live, ${s.sandboxes.processesAlive} processes alive, ${s.sandboxes.directoriesLeft} directories left`
        : `${s.sandboxes.acquired} acquired; ${s.sandboxes.liveAtProvisioner} still live at the provisioner (external: processes and directories not checked)`,
    );
  }
  if (s.leaks.made > 0) {
    add(
      'leaks',
      interrupted || s.leaks.stillLive < 0
        ? `${s.leaks.made} leaked on purpose (a crash between create and record); ${s.leaks.reclaimed} reclaimed before the stop`
        : `${s.leaks.made} leaked on purpose (a crash between create and record); the reclaimer deleted ${s.leaks.reclaimed}, ${s.leaks.stillLive} still live`,
    );
  }
  const failures = Object.entries(s.releases.failuresByCode).sort((a, b) => b[1] - a[1]);
  add(
    'faults',
    failures.length === 0
      ? 'no attempt failed'
      : `${s.releases.failedAttempts} failed attempts, each retried after a backoff:`,
  );
  for (const [code, count] of failures)
    more(`${String(count).padStart(4)} × ${code} (${FAILURE_MEANING[code] ?? 'see the log'})`);
  add(
    'releases',
    `${s.releases.succeeded} succeeded (${entries(s.releases.byOutcome) || 'none'})${
      s.releases.durationMs.p50 !== null
        ? `, taking p50 ${ms(s.releases.durationMs.p50)}, max ${ms(s.releases.durationMs.max)}`
        : ''
    }`,
  );
  add(
    'waits',
    `${plural(s.deferrals, 'fence check')} deferred while a subagent still ran; ${plural(s.reannouncedBySweeper, 'fence')} re-announced by the sweeper`,
  );
  if (s.deadLetters.count === 0) add('dead letters', 'none');
  else {
    add('dead letters', `${s.deadLetters.count} (${s.deadLetters.inQueues} new in the dead-letter queues):`);
    for (const letter of s.deadLetters.items) {
      more(
        `${letter.runId ?? '(no run id)'} from ${letter.queue}, ${letter.errorCode}: ${letter.reason}${letter.recovered ? ' → recovered: the sweeper re-announced the fence and it was cleared' : ''}`,
      );
    }
  }
  const latency = s.cleanupLatencyMs;
  add(
    'latency',
    latency.samples
      ? `fence set → cleared: p50 ${ms(latency.p50)}, p99 ${ms(latency.p99)}, max ${ms(latency.max)} (${latency.samples} cleanups)`
      : 'no cleanup finished',
  );
  const lease = s.leaseRenewals;
  add(
    'leases',
    `${lease.renewals} renewals, longest ${lease.longestWaitMs.toFixed(1)} ms${
      lease.longestWaitWhileDeleteHungMs !== null
        ? `; ${lease.longestWaitWhileDeleteHungMs.toFixed(1)} ms while a delete hung`
        : ''
    } (bound ${lease.boundMs} ms)`,
  );
  if (lease.eventLoopDelayMaxMs !== null) {
    more(`this process's event loop lagged up to ${lease.eventLoopDelayMaxMs} ms meanwhile: CPU, not a lock`);
  }
  add(
    'admissions',
    s.admissions.runsThatWaited === 0
      ? 'no run had to wait for a cleanup'
      : `${plural(s.admissions.runsThatWaited, 'run')} waited for the cleanup of their scope (longest ${ms(s.admissions.longestWaitMs)}); runtime_cleanup_blocked refused ${plural(s.admissions.refusedAttempts, 'attempt')} meanwhile`,
  );
  if (s.faultsStoppedAtSeconds !== null) {
    add('faults off', `at ${s.faultsStoppedAtSeconds} s (--faults-stop-after), to let the tail converge`);
  }
  if (s.files.timeline) add('timeline', s.files.timeline);
  add('log', `${s.files.log} (${s.lines.total} lines)`);

  if (s.checks.length) {
    lines.push('', 'Checks (database, provisioner, processes, files)');
    for (const check of s.checks) lines.push(`  ${mark(check.ok)} ${check.name.padEnd(38)}${check.detail}`);
  }
  lines.push('');
  switch (s.outcome) {
    case DemoOutcome.CONVERGED:
      lines.push(
        `${mark(true)} Converged${s.convergedSecondsAfterLastRun !== null ? ` ${s.convergedSecondsAfterLastRun} s after the last run finished` : ''}; ${s.durationSeconds} s in all. Exit 0.`,
      );
      break;
    case DemoOutcome.INTERRUPTED:
      lines.push(`Interrupted after ${s.durationSeconds} s and stopped: ${left}. Exit ${s.exitCode}.`);
      break;
    case DemoOutcome.FAILED:
      lines.push(`${mark(false)} Failed after ${s.durationSeconds} s (${left}). Exit ${s.exitCode}.`);
      break;
    default:
      lines.push(
        `${mark(false)} Not converged after ${s.durationSeconds} s; after stopping, ${left}. Exit ${s.exitCode}.`,
      );
  }
  for (const reason of s.reasons) lines.push(`  - ${reason}`);
  return `${lines.join('\n')}\n`;
}

function leftBehind(s: DemoSummary): string {
  const postgres =
    s.stopped.postgresStopped === null
      ? ''
      : s.stopped.postgresStopped
        ? ', PostgreSQL stopped'
        : ', PostgreSQL STILL RUNNING';
  return `${s.stopped.sandboxProcessesLeft} sandbox processes and ${s.stopped.sandboxDirectoriesLeft} sandbox directories left${postgres}`;
}

function plural(count: number, noun: string): string {
  return `${count} ${noun}${count === 1 ? '' : 's'}`;
}

function entries(record: Record<string, number>): string {
  return Object.entries(record)
    .sort((a, b) => b[1] - a[1])
    .map(([key, count]) => `${count} ${key}`)
    .join(', ');
}

function ms(value: number | null): string {
  if (value === null) return '–';
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value} ms`;
}
