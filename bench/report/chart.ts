/**
 * The README's chart, hand-written SVG (no dependency): lease-renewal p99 against delete latency,
 * baseline and split, on a logarithmic time axis — on a linear one the split's line would be
 * indistinguishable from zero next to the baseline's seconds.
 */
export interface ChartSeries {
  label: string;
  color: string;
  /** One value per category; undefined where the figure is missing or invalid. */
  values: Array<number | undefined>;
  /** Value labels under the points instead of above (keeps two close lines readable). */
  labelBelow?: boolean;
}

export interface ChartOptions {
  title: string;
  subtitle: string;
  categories: readonly string[];
  xLabel: string;
  yLabel: string;
  series: readonly ChartSeries[];
  /** A dashed horizontal line, e.g. the target. */
  threshold?: { value: number; label: string };
}

const WIDTH = 800;
const HEIGHT = 420;
const MARGIN = { top: 64, right: 230, bottom: 64, left: 76 } as const;

function escapeXml(text: string): string {
  return text.replace(/[<>&"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function formatMs(value: number): string {
  if (value >= 1000) return `${Math.round(value / 100) / 10} s`;
  if (value >= 10) return `${Math.round(value)} ms`;
  return `${Math.round(value * 10) / 10} ms`;
}

export function renderLineChart(options: ChartOptions): string {
  const plotWidth = WIDTH - MARGIN.left - MARGIN.right;
  const plotHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
  const values = options.series.flatMap((s) => s.values.filter((v): v is number => v !== undefined && v > 0));
  if (options.threshold) values.push(options.threshold.value);
  const low = Math.floor(Math.log10(Math.max(0.1, Math.min(...values, 1))));
  const high = Math.max(low + 1, Math.ceil(Math.log10(Math.max(...values, 10))));
  const y = (value: number) =>
    MARGIN.top + plotHeight - ((Math.log10(Math.max(value, 10 ** low)) - low) / (high - low)) * plotHeight;
  const step = plotWidth / options.categories.length;
  const x = (index: number) => MARGIN.left + step * (index + 0.5);

  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${HEIGHT}" viewBox="0 0 ${WIDTH} ${HEIGHT}" font-family="system-ui, -apple-system, 'Segoe UI', sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${HEIGHT}" fill="#ffffff"/>`,
    `<text x="${MARGIN.left}" y="26" font-size="16" font-weight="600" fill="#111">${escapeXml(options.title)}</text>`,
    `<text x="${MARGIN.left}" y="46" fill="#555">${escapeXml(options.subtitle)}</text>`,
  );
  for (let exponent = low; exponent <= high; exponent += 1) {
    const value = 10 ** exponent;
    const gy = y(value).toFixed(1);
    parts.push(
      `<line x1="${MARGIN.left}" x2="${MARGIN.left + plotWidth}" y1="${gy}" y2="${gy}" stroke="#e5e5e5"/>`,
      `<text x="${MARGIN.left - 8}" y="${gy}" text-anchor="end" dominant-baseline="middle" fill="#555">${escapeXml(formatMs(value))}</text>`,
    );
  }
  parts.push(
    `<line x1="${MARGIN.left}" x2="${MARGIN.left}" y1="${MARGIN.top}" y2="${MARGIN.top + plotHeight}" stroke="#999"/>`,
    `<line x1="${MARGIN.left}" x2="${MARGIN.left + plotWidth}" y1="${MARGIN.top + plotHeight}" y2="${MARGIN.top + plotHeight}" stroke="#999"/>`,
  );
  options.categories.forEach((category, index) => {
    parts.push(
      `<text x="${x(index).toFixed(1)}" y="${MARGIN.top + plotHeight + 20}" text-anchor="middle" fill="#333">${escapeXml(category)}</text>`,
    );
  });
  parts.push(
    `<text x="${MARGIN.left + plotWidth / 2}" y="${HEIGHT - 16}" text-anchor="middle" fill="#333">${escapeXml(options.xLabel)}</text>`,
    `<text transform="translate(18 ${MARGIN.top + plotHeight / 2}) rotate(-90)" text-anchor="middle" fill="#333">${escapeXml(options.yLabel)}</text>`,
  );
  if (options.threshold) {
    const ty = y(options.threshold.value).toFixed(1);
    parts.push(
      `<line x1="${MARGIN.left}" x2="${MARGIN.left + plotWidth}" y1="${ty}" y2="${ty}" stroke="#2a9d3a" stroke-dasharray="6 4"/>`,
      `<text x="${MARGIN.left + plotWidth + 8}" y="${ty}" dominant-baseline="middle" fill="#2a9d3a">${escapeXml(options.threshold.label)}</text>`,
    );
  }
  options.series.forEach((series, seriesIndex) => {
    const points = series.values.flatMap((value, index) =>
      value === undefined ? [] : [{ px: x(index), py: y(value), value }],
    );
    if (points.length > 1) {
      parts.push(
        `<polyline fill="none" stroke="${series.color}" stroke-width="2.5" points="${points.map((p) => `${p.px.toFixed(1)},${p.py.toFixed(1)}`).join(' ')}"/>`,
      );
    }
    for (const point of points) {
      parts.push(
        `<circle cx="${point.px.toFixed(1)}" cy="${point.py.toFixed(1)}" r="4" fill="${series.color}"/>`,
        `<text x="${(point.px + 7).toFixed(1)}" y="${(point.py + (series.labelBelow ? 17 : -8)).toFixed(1)}" fill="${series.color}">${escapeXml(formatMs(point.value))}</text>`,
      );
    }
    const ly = MARGIN.top + 10 + seriesIndex * 22;
    const lx = MARGIN.left + plotWidth + 8;
    parts.push(
      `<line x1="${lx}" x2="${lx + 22}" y1="${ly}" y2="${ly}" stroke="${series.color}" stroke-width="2.5"/>`,
      `<text x="${lx + 28}" y="${ly}" dominant-baseline="middle" fill="#222">${escapeXml(series.label)}</text>`,
    );
  });
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}
