/**
 * The SVG timeline of a sample of cleanups: one row per run, time in seconds since the demo
 * started. Each row runs from the fence being set to the fence being cleared:
 *
 *   grey   fence set → release requested (phase 1, the fence check, and any deferral)
 *   amber  release requested → the successful delete began (queueing, failed attempts, backoff)
 *   blue   the successful delete (phase 2)
 *   green  delete confirmed → fence cleared (phase 3)
 *   red    ticks: failed attempts, each retried; a hatched red span: a delete that hung until
 *          its timeout aborted it
 *
 * Hand-written SVG, no dependency; every text is escaped.
 */
import { type CleanupRecord, HUNG_ERROR_CODES } from './model.ts';

export interface TimelineOptions {
  /** Epoch ms that is 0 s on the axis. */
  origin: number;
  /** How many cleanups to show. */
  sample: number;
  deleteTimeoutMs: number;
  cleanupTimeoutMs: number;
  title: string;
}

const COLORS = {
  check: '#9ca3af',
  waiting: '#f59e0b',
  release: '#2563eb',
  finalize: '#16a34a',
  failure: '#dc2626',
  axis: '#374151',
  grid: '#e5e7eb',
} as const;

const LAYOUT = { width: 1000, left: 210, right: 20, top: 64, row: 18, bar: 10, legend: 70 } as const;

/**
 * Picks the cleanups to draw: those with retries or deferrals first (up to half the sample, more
 * if there are too few plain ones), the rest plain ones; each group spread evenly over the run.
 */
export function sampleCleanups(runs: readonly CleanupRecord[], sample: number): CleanupRecord[] {
  const complete = runs.filter((run) => run.clearedAt !== undefined && run.finishedAt !== undefined);
  const isEventful = (run: CleanupRecord) => run.failures.length > 0 || run.deferrals.length > 0;
  const eventful = complete.filter(isEventful);
  const plain = complete.filter((run) => !isEventful(run));
  const eventfulCount = Math.min(eventful.length, Math.max(Math.ceil(sample / 2), sample - plain.length));
  const chosen = [...spread(eventful, eventfulCount), ...spread(plain, sample - eventfulCount)];
  return chosen.sort((a, b) => fenceSetAt(a) - fenceSetAt(b));
}

/** `count` items taken at even steps through `items` (all of them if there are not more). */
function spread<T>(items: readonly T[], count: number): T[] {
  if (count <= 0) return [];
  if (items.length <= count) return [...items];
  const step = items.length / count;
  return Array.from({ length: count }, (_, index) => items[Math.floor(index * step)]!);
}

/** When the fence went up: finalize's own measurement when there is one (database clock). */
export function fenceSetAt(run: CleanupRecord): number {
  if (run.clearedAt !== undefined && run.cleanupLatencyMs !== undefined)
    return run.clearedAt - run.cleanupLatencyMs;
  return run.finishedAt ?? run.admittedAt;
}

export function renderTimeline(runs: readonly CleanupRecord[], options: TimelineOptions): string {
  const rows = sampleCleanups(runs, options.sample);
  const seconds = (at: number) => (at - options.origin) / 1000;
  const end = Math.max(1, ...rows.map((run) => seconds(run.clearedAt ?? run.finishedAt ?? options.origin)));
  const start = Math.max(0, Math.min(end, ...rows.map((run) => seconds(fenceSetAt(run)))));
  const span = Math.max(0.5, end - start);
  const plotWidth = LAYOUT.width - LAYOUT.left - LAYOUT.right;
  const x = (at: number) => LAYOUT.left + ((seconds(at) - start) / span) * plotWidth;
  const height = LAYOUT.top + rows.length * LAYOUT.row + LAYOUT.legend;
  const parts: string[] = [];

  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${LAYOUT.width}" height="${height}" viewBox="0 0 ${LAYOUT.width} ${height}" font-family="ui-monospace, Menlo, monospace" font-size="11">`,
    '<defs><pattern id="hung" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">' +
      `<rect width="6" height="6" fill="#fee2e2"/><line x1="0" y1="0" x2="0" y2="6" stroke="${COLORS.failure}" stroke-width="2"/></pattern></defs>`,
    `<rect width="${LAYOUT.width}" height="${height}" fill="#ffffff"/>`,
    `<text x="${LAYOUT.left}" y="20" font-size="14" font-weight="bold">${escapeXml(options.title)}</text>`,
    `<text x="${LAYOUT.left}" y="36" fill="${COLORS.axis}">${escapeXml(
      `${rows.length} of ${runs.length} cleanups, fence set → cleared; seconds since the demo started`,
    )}</text>`,
  );

  for (const tick of axisTicks(start, start + span)) {
    const tx = LAYOUT.left + ((tick - start) / span) * plotWidth;
    parts.push(
      `<line x1="${f(tx)}" y1="${LAYOUT.top - 8}" x2="${f(tx)}" y2="${LAYOUT.top + rows.length * LAYOUT.row}" stroke="${COLORS.grid}"/>`,
      `<text x="${f(tx)}" y="${LAYOUT.top - 12}" text-anchor="middle" fill="${COLORS.axis}">${escapeXml(formatTick(tick))}</text>`,
    );
  }

  rows.forEach((run, index) => {
    const y = LAYOUT.top + index * LAYOUT.row;
    const barY = y + (LAYOUT.row - LAYOUT.bar) / 2;
    const label = `${run.runId.slice(0, 12)} ${run.status ?? ''}`;
    parts.push(
      `<text x="${LAYOUT.left - 8}" y="${y + LAYOUT.row / 2 + 4}" text-anchor="end">${escapeXml(label)}</text>`,
    );
    const set = fenceSetAt(run);
    const requested = run.releaseRequestedAt ?? set;
    const releaseStart = run.releaseStartedAt ?? requested;
    const released = run.releasedAt ?? releaseStart;
    const cleared = run.clearedAt ?? released;
    const segment = (from: number, to: number, color: string, what: string) => {
      if (to <= from) return;
      parts.push(
        `<rect x="${f(x(from))}" y="${f(barY)}" width="${f(Math.max(1, x(to) - x(from)))}" height="${LAYOUT.bar}" fill="${color}"><title>${escapeXml(
          `${what}: ${((to - from) / 1000).toFixed(2)} s`,
        )}</title></rect>`,
      );
    };
    segment(set, requested, COLORS.check, 'fence check');
    segment(requested, releaseStart, COLORS.waiting, 'waiting for a successful delete');
    segment(releaseStart, released, COLORS.release, 'delete');
    segment(released, cleared, COLORS.finalize, 'finalize');
    for (const failure of run.failures) {
      if (HUNG_ERROR_CODES.has(failure.errorCode)) {
        const spanMs =
          failure.errorCode === 'CLEANUP_TIMEOUT' ? options.cleanupTimeoutMs : options.deleteTimeoutMs;
        const from = Math.max(set, failure.at - spanMs);
        parts.push(
          `<rect x="${f(x(from))}" y="${f(barY)}" width="${f(Math.max(1, x(failure.at) - x(from)))}" height="${LAYOUT.bar}" fill="url(#hung)" stroke="${COLORS.failure}" stroke-width="0.5"/>`,
        );
      }
      parts.push(
        `<line x1="${f(x(failure.at))}" y1="${f(barY - 3)}" x2="${f(x(failure.at))}" y2="${f(barY + LAYOUT.bar + 3)}" stroke="${COLORS.failure}" stroke-width="2"><title>${escapeXml(
          `${failure.phase} failed: ${failure.errorCode}${failure.retryInSeconds ? `, retry in ${failure.retryInSeconds} s` : ''}`,
        )}</title></line>`,
      );
    }
    for (const deferral of run.deferrals) {
      parts.push(
        `<circle cx="${f(x(deferral))}" cy="${f(barY + LAYOUT.bar / 2)}" r="3" fill="none" stroke="${COLORS.axis}"><title>deferred: a run of the scope was still active</title></circle>`,
      );
    }
  });

  const legendY = LAYOUT.top + rows.length * LAYOUT.row + 28;
  const legend: Array<[string, string]> = [
    [COLORS.check, 'fence check'],
    [COLORS.waiting, 'waiting (queue, backoff)'],
    [COLORS.release, 'delete'],
    [COLORS.finalize, 'finalize'],
    ['url(#hung)', 'delete hung until its timeout'],
  ];
  let legendX = LAYOUT.left;
  for (const [color, label] of legend) {
    parts.push(
      `<rect x="${legendX}" y="${legendY - 9}" width="14" height="10" fill="${color}"/>`,
      `<text x="${legendX + 18}" y="${legendY}">${escapeXml(label)}</text>`,
    );
    legendX += 26 + label.length * 6.6;
  }
  parts.push(
    `<line x1="${LAYOUT.left}" y1="${legendY + 10}" x2="${LAYOUT.left}" y2="${legendY + 22}" stroke="${COLORS.failure}" stroke-width="2"/>`,
    `<text x="${LAYOUT.left + 8}" y="${legendY + 20}">${escapeXml('failed attempt (retried)')}</text>`,
    `<circle cx="${LAYOUT.left + 200}" cy="${legendY + 16}" r="3" fill="none" stroke="${COLORS.axis}"/>`,
    `<text x="${LAYOUT.left + 208}" y="${legendY + 20}">${escapeXml('deferred: the scope still had an active run')}</text>`,
    '</svg>',
  );
  return `${parts.join('\n')}\n`;
}

export function escapeXml(value: string): string {
  return value.replace(/[&<>"']/g, (character) => `&#${character.charCodeAt(0)};`);
}

function axisTicks(from: number, to: number): number[] {
  const span = to - from;
  const step = [0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300].find((candidate) => span / candidate <= 12) ?? 600;
  const ticks: number[] = [];
  for (let tick = Math.ceil(from / step) * step; tick <= to + 1e-9; tick += step) ticks.push(tick);
  return ticks;
}

function formatTick(value: number): string {
  return Number.isInteger(value) ? `${value} s` : `${value.toFixed(1)} s`;
}

/** Coordinates with two decimals keep the file small. */
function f(value: number): string {
  return (Math.round(value * 100) / 100).toString();
}
