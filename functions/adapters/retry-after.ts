/**
 * `Retry-After` (RFC 9110, section 10.2.3): either delta-seconds or an HTTP-date, turned into
 * whole seconds from `now`. The value comes from the provisioner and is untrusted: anything that
 * is not exactly one of those forms (a negative number, a fraction, garbage, an impossible date,
 * an overlong header) counts as absent, and a date in the past as 0 — the caller's own backoff
 * then applies unchanged. A huge value is returned as it is; the caller caps it.
 *
 * HTTP-date has three forms, and a recipient must accept all three (RFC 9110, section 5.6.7):
 *
 *   IMF-fixdate  Sun, 06 Nov 1994 08:49:37 GMT
 *   rfc850       Sunday, 06-Nov-94 08:49:37 GMT
 *   asctime      Sun Nov  6 08:49:37 1994
 *
 * They are parsed here by hand, as UTC: `Date.parse` would read an asctime date in the local time
 * zone, and accepts many strings ("-5", "1") that are not HTTP-dates at all.
 */
const MAX_HEADER_LENGTH = 64;

const DELTA_SECONDS = /^\d+$/;
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const MONTH = `(${MONTHS.join('|')})`;
const TIME = '(\\d{2}):(\\d{2}):(\\d{2})';
const IMF_FIXDATE = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\\d{2}) ${MONTH} (\\d{4}) ${TIME} GMT$`);
const RFC850_DATE = new RegExp(
  `^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\\d{2})-${MONTH}-(\\d{2}) ${TIME} GMT$`,
);
const ASCTIME_DATE = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ${MONTH} ([ \\d]\\d) ${TIME} (\\d{4})$`);

export function parseRetryAfter(
  header: string | readonly string[] | undefined,
  now: number = Date.now(),
): number | undefined {
  // Several Retry-After fields are a broken answer; take none rather than guess which one holds.
  const value = Array.isArray(header) ? (header.length === 1 ? header[0] : undefined) : header;
  if (typeof value !== 'string' || value.length > MAX_HEADER_LENGTH) return undefined;
  const text = value.trim();
  if (DELTA_SECONDS.test(text)) return Number(text);
  const date = parseHttpDate(text, now);
  if (date === undefined) return undefined;
  return Math.max(0, Math.ceil((date - now) / 1000));
}

/** Milliseconds since the epoch of an HTTP-date, or undefined when `text` is not one. */
export function parseHttpDate(text: string, now: number = Date.now()): number | undefined {
  let match = IMF_FIXDATE.exec(text);
  if (match) return utc(Number(match[3]), match[2]!, Number(match[1]), match.slice(4, 7));
  match = RFC850_DATE.exec(text);
  if (match) return utc(fullYear(Number(match[3]), now), match[2]!, Number(match[1]), match.slice(4, 7));
  match = ASCTIME_DATE.exec(text);
  if (match) return utc(Number(match[6]), match[1]!, Number(match[2]!.trim()), match.slice(3, 6));
  return undefined;
}

/** RFC 9110: a two-digit year more than 50 years in the future is a year of the past century. */
function fullYear(twoDigits: number, now: number): number {
  const currentYear = new Date(now).getUTCFullYear();
  let year = Math.floor(currentYear / 100) * 100 + twoDigits;
  if (year > currentYear + 50) year -= 100;
  return year;
}

function utc(year: number, monthName: string, day: number, time: string[]): number | undefined {
  const month = MONTHS.indexOf(monthName);
  const [hours, minutes, seconds] = time.map(Number) as [number, number, number];
  if (hours > 23 || minutes > 59 || seconds > 60) return undefined;
  const epochMs = Date.UTC(year, month, day, hours, minutes, Math.min(seconds, 59));
  // Date.UTC rolls 31 Feb over into March: such a date is not a date.
  if (new Date(epochMs).getUTCDate() !== day) return undefined;
  return epochMs;
}
