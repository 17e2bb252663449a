/**
 * The live progress display. On a terminal: a block of lines redrawn about ten times a second
 * (ANSI: cursor up, clear line), with notable events printed above it. Elsewhere (a pipe, a CI
 * log, a test): one plain line per second when something changed, and one line per notable event.
 */
import type { ProgressSnapshot } from './model.ts';

export interface ProgressDisplay {
  start(): void;
  /** A line worth keeping in the scrollback (a dead letter, a phase change); ignored once stopped. */
  note(text: string): void;
  /** Removes the live block (TTY) and stops refreshing. */
  stop(): void;
}

export interface DisplayOptions {
  write: (text: string) => void;
  snapshot: () => ProgressSnapshot;
  interactive: boolean;
  columns?: number;
  /** No output at all (--quiet). */
  silent?: boolean;
}

const TTY_REFRESH_MS = 100;
const PLAIN_REFRESH_MS = 1000;
const ANSI = {
  hideCursor: '\x1b[?25l',
  showCursor: '\x1b[?25h',
  up: (lines: number) => `\x1b[${lines}F`,
  clearLine: '\x1b[2K',
  dim: (text: string) => `\x1b[2m${text}\x1b[22m`,
  bold: (text: string) => `\x1b[1m${text}\x1b[22m`,
} as const;

export function createDisplay(options: DisplayOptions): ProgressDisplay {
  if (options.silent) return { start() {}, note() {}, stop() {} };
  return options.interactive ? terminalDisplay(options) : plainDisplay(options);
}

function terminalDisplay(options: DisplayOptions): ProgressDisplay {
  let drawn = 0;
  let running = false;
  let timer: NodeJS.Timeout | undefined;
  const columns = options.columns ?? 100;
  // A line wider than the terminal would wrap and break the cursor arithmetic of the redraw.
  const clip = (line: string) =>
    visibleLength(line) > columns - 1 ? `${stripAnsi(line).slice(0, columns - 2)}…` : line;
  const erase = () => {
    if (drawn > 0) options.write(ANSI.up(drawn) + `${ANSI.clearLine}\n`.repeat(drawn) + ANSI.up(drawn));
    drawn = 0;
  };
  const draw = () => {
    const lines = blockLines(options.snapshot()).map(clip);
    let out = drawn > 0 ? ANSI.up(drawn) : '';
    for (const line of lines) out += `${ANSI.clearLine}${line}\n`;
    // A shorter block than last time leaves stale lines below: clear them.
    for (let i = lines.length; i < drawn; i += 1) out += `${ANSI.clearLine}\n`;
    const extra = Math.max(0, drawn - lines.length);
    if (extra > 0) out += ANSI.up(extra);
    options.write(out);
    drawn = lines.length;
  };
  return {
    start() {
      running = true;
      options.write(ANSI.hideCursor);
      draw();
      timer = setInterval(draw, TTY_REFRESH_MS);
      timer.unref();
    },
    note(text) {
      if (!running) return;
      erase();
      options.write(`${text}\n`);
      draw();
    },
    stop() {
      if (!running) return;
      running = false;
      clearInterval(timer);
      draw();
      options.write(ANSI.showCursor);
      drawn = 0;
    },
  };
}

function plainDisplay(options: DisplayOptions): ProgressDisplay {
  let timer: NodeJS.Timeout | undefined;
  let running = false;
  let last = '';
  const tick = () => {
    const snapshot = options.snapshot();
    const line = plainLine(snapshot);
    if (line === last) return;
    last = line;
    options.write(`[${seconds(snapshot.elapsedMs)}] ${line}\n`);
  };
  return {
    start() {
      running = true;
      timer = setInterval(tick, PLAIN_REFRESH_MS);
      timer.unref();
    },
    note(text) {
      if (running) options.write(`[${seconds(options.snapshot().elapsedMs)}] ${text}\n`);
    },
    stop() {
      if (!running) return;
      running = false;
      clearInterval(timer);
      tick();
    },
  };
}

/** Short names for the error codes a failed attempt logs, for the live display. */
const SHORT_CODES: Record<string, string> = {
  PROVISIONER_UNAVAILABLE: '5xx',
  PROVISIONER_DELETE_TIMEOUT: 'hung',
  CLEANUP_TIMEOUT: 'hung',
  PROVISIONER_CONNECTION: 'reset',
  RELEASE_LOCK_TIMEOUT: 'lock wait',
};

function failureMix(s: ProgressSnapshot): string {
  const counts = new Map<string, number>();
  for (const [code, count] of Object.entries(s.failuresByCode)) {
    const label = SHORT_CODES[code] ?? code;
    counts.set(label, (counts.get(label) ?? 0) + count);
  }
  return [...counts.entries()]
    .sort((a, b) => b[1] - a[1])
    .map(([label, count]) => `${count} ${label}`)
    .join(', ');
}

/** One status line, for logs and pipes. */
export function plainLine(s: ProgressSnapshot): string {
  const mix = failureMix(s);
  return [
    `runs ${s.runs.finished}/${s.runs.total} finished, ${s.runs.running} running, ${s.runs.waitingForFence} waiting for a fence`,
    `fences ${s.fences.cleared} cleared, ${s.fences.pending} pending`,
    `releases ${s.releases.inFlight} in flight, ${s.releases.retrying} in backoff`,
    `retries ${s.retries}${mix ? ` (${mix})` : ''}`,
    `dead letters ${s.deadLetters}`,
    `longest lease renewal ${s.leases.longestWaitMs.toFixed(1)} ms`,
  ].join(' · ');
}

/** The redrawn block, for terminals (fits 80 columns in the common case; clipped otherwise). */
export function blockLines(s: ProgressSnapshot): string[] {
  const mix = failureMix(s);
  return [
    ANSI.bold(
      `runtime-cleanup demo · ${seconds(s.elapsedMs).trim()}${s.workloadFinished ? ' · all runs finished, converging' : ''}`,
    ),
    `  runs      ${bar(s.runs.finished, s.runs.total)} ${s.runs.finished}/${s.runs.total} finished · ${s.runs.running} running`,
    `  fences    ${bar(s.fences.cleared, Math.max(s.fences.set, 1))} ${s.fences.cleared}/${s.fences.set} cleared · ${s.fences.pending} pending`,
    `  releases  ${s.releases.inFlight} in flight · ${s.releases.retrying} in backoff · ${s.releases.done} done`,
    `  retries   ${s.retries}${mix ? ANSI.dim(` (${mix})`) : ''} · deferrals ${s.deferrals} · dead letters ${s.deadLetters}`,
    `  leases    ${s.leases.renewals} renewals · longest wait ${s.leases.longestWaitMs.toFixed(1)} ms`,
    `  admission ${s.runs.admitted} admitted · ${s.refusedAdmissions} refused (scope fenced) · ${s.runs.waitingForFence} waiting`,
  ];
}

function bar(done: number, total: number, width = 20): string {
  const filled = total > 0 ? Math.min(width, Math.round((done / total) * width)) : 0;
  return `${'█'.repeat(filled)}${'░'.repeat(width - filled)}`;
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1).padStart(5)} s`;
}

function visibleLength(line: string): number {
  return stripAnsi(line).length;
}

function stripAnsi(line: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: ANSI escapes are control sequences.
  return line.replace(/\x1b\[[0-9;]*[A-Za-z]/g, '');
}
