/**
 * Removes credentials from text before it is printed: error messages, log fields, dead-letter
 * reasons, configuration values. Both forms of a PostgreSQL connection string are covered:
 *
 * - URL: `postgres://user:password@host/db` keeps the user and loses the password, up to the
 *   LAST `@` of the authority (URL parsers accept a raw `@` in a password, and stopping at the
 *   first one printed the rest); token-like query parameters lose their values, whatever their
 *   case and prefix (`?sslpassword=`, `&token=`, `&x-api-key=`, `&X-Amz-Signature=`, `&code=`…).
 * - keyword/value (libpq): `host=db password=secret`, `password = 'se cret'` (single quotes with
 *   `\'` and `\\` escapes), `PGPASSWORD=…`, `DB_PASSWORD: …`, `"password":"…"`: the value of any
 *   key that ends in `password` or `passwd` is hidden — a quoted value to its closing quote, a bare
 *   one to the next blank.
 * - HTTP credentials: the token after `Bearer ` (an `Authorization` header quoted in a message, a
 *   provisioner echoing the request's header into its answer), whatever the case.
 *
 * Everything is a single left-to-right scan per form, in linear time: the text can be hostile (a
 * 1 MB message body quoted in an error) and the previous regular expressions backtracked, taking
 * 19 s on 64 KB. Hiding too much is harmless; showing a password is not.
 */
export const REDACTED = '***';

/** Free text: any number of URLs and assignments anywhere in it. */
export function redactSecrets(text: string): string {
  return redactBearerTokens(redactAssignments(redactQueryParameters(redactUrlPasswords(text))));
}

/**
 * One value that is meant to be a connection string or URL (a DATABASE_URL, an endpoint). Where it
 * is a URL that does not parse, nothing says where its password ends: hide everything from the
 * user's `:` to the last `@`, the way `postgres://admin:s3cr3t pw@x@db:99999/app` needs.
 */
export function redactConnectionString(value: string): string {
  const scheme = value.indexOf('://');
  if (scheme !== -1 && !URL.canParse(value)) {
    const at = value.lastIndexOf('@');
    const colon = value.indexOf(':', scheme + 3);
    if (at > scheme && colon !== -1 && colon < at) {
      return redactSecrets(`${value.slice(0, colon + 1)}${REDACTED}${value.slice(at)}`);
    }
  }
  return redactSecrets(value);
}

// --- URLs ---------------------------------------------------------------------------------------

/**
 * The authority of a URL runs to the first `/`, `?` or `#` (or a line break): a password may not
 * hold those unencoded. One forward pass over it finds the user's `:` and the last `@`; it stops
 * at the next `/` at the latest, which is where the next `://` begins, so no character is looked
 * at twice.
 */
function redactUrlPasswords(text: string): string {
  const out: string[] = [];
  let copied = 0;
  let search = 0;
  for (;;) {
    const scheme = text.indexOf('://', search);
    if (scheme === -1) break;
    const start = scheme + 3;
    let colon = -1;
    let at = -1;
    let end = start;
    for (; end < text.length; end += 1) {
      const c = text.charCodeAt(end);
      if (c === 0x2f || c === 0x3f || c === 0x23 || c === 0x0a || c === 0x0d) break;
      if (c === 0x3a && colon === -1) colon = end;
      else if (c === 0x40) at = end;
    }
    if (colon !== -1 && at > colon) {
      out.push(text.slice(copied, colon + 1), REDACTED);
      copied = at;
    }
    search = end;
  }
  if (copied === 0) return text;
  out.push(text.slice(copied));
  return out.join('');
}

// --- Query parameters ---------------------------------------------------------------------------

/**
 * Names whose value is a credential, compared after lower-casing and dropping `-`, `_` and `.`
 * (`X-Amz-Security-Token` → `xamzsecuritytoken`): a name that ENDS in one of these is secret, so
 * prefixed forms (`x-api-key`, `client_secret`, `X-Amz-Signature`, `sessiontoken`) are covered
 * without listing each. Hiding a harmless `?sortkey=` is the price; showing a key is not an option.
 */
const SECRET_NAME_ENDINGS = [
  'password',
  'passwd',
  'pwd',
  'token',
  'secret',
  'key',
  'sig',
  'signature',
  'credential',
  'credentials',
  'auth',
  'authorization',
  'jwt',
] as const;
/** Secret only as the whole name: as an ending they would hide ordinary parameters (`zipcode`). */
const SECRET_NAMES: ReadonlySet<string> = new Set(['code', 'session', 'sid', 'otp']);

/** Longer parameter names are not looked at: this bounds the work per `?`/`&`. */
const MAX_PARAMETER_NAME = 64;

function isNameSeparator(c: number): boolean {
  return c === 0x2d || c === 0x5f || c === 0x2e; // - _ .
}

/**
 * Whether text[start, end), lower-cased and without separators, ends with `word` (`whole`: IS
 * `word`). Compares in place, from the end: no copy per parameter, so hostile text full of
 * parameters costs no more than reading it.
 */
function nameMatches(text: string, start: number, end: number, word: string, whole: boolean): boolean {
  let at = end - 1;
  for (let w = word.length - 1; w >= 0; w -= 1) {
    while (at >= start && isNameSeparator(text.charCodeAt(at))) at -= 1;
    if (at < start) return false;
    let c = text.charCodeAt(at);
    if (c >= 0x41 && c <= 0x5a) c += 0x20;
    if (c !== word.charCodeAt(w)) return false;
    at -= 1;
  }
  if (!whole) return true;
  while (at >= start && isNameSeparator(text.charCodeAt(at))) at -= 1;
  return at < start;
}

function isSecretName(text: string, start: number, end: number): boolean {
  for (const ending of SECRET_NAME_ENDINGS) if (nameMatches(text, start, end, ending, false)) return true;
  for (const name of SECRET_NAMES) if (nameMatches(text, start, end, name, true)) return true;
  return false;
}

/** Whether a query parameter of this name has its value hidden (case and `-`/`_`/`.` ignored). */
export function isSecretParameterName(name: string): boolean {
  return isSecretName(name, 0, name.length);
}

function isNameCharacter(c: number): boolean {
  return (
    (c >= 0x30 && c <= 0x39) || // 0-9
    (c >= 0x41 && c <= 0x5a) || // A-Z
    (c >= 0x61 && c <= 0x7a) || // a-z
    c === 0x2d || // -
    c === 0x5f || // _
    c === 0x2e // .
  );
}

/** Where a value ends: `&`, `;`, `#`, a blank or a quote (what closes a URL inside a message). */
function isValueEnd(c: number): boolean {
  return c === 0x26 || c === 0x3b || c === 0x23 || c === 0x22 || c === 0x27 || c <= 0x20;
}

/**
 * `?name=value` / `&name=value` / `;name=value` with a secret name: the value is hidden. One
 * forward scan; a name is read at most MAX_PARAMETER_NAME characters far and the scan resumes
 * after what it read, so no character is looked at more than twice.
 */
function redactQueryParameters(text: string): string {
  if (!text.includes('=')) return text;
  const out: string[] = [];
  let copied = 0;
  let i = 0;
  while (i < text.length) {
    const c = text.charCodeAt(i);
    i += 1;
    if (c !== 0x3f && c !== 0x26 && c !== 0x3b) continue; // ? & ;
    const nameStart = i;
    while (i < text.length && i - nameStart <= MAX_PARAMETER_NAME && isNameCharacter(text.charCodeAt(i)))
      i += 1;
    if (i === nameStart || text.charCodeAt(i) !== 0x3d) continue; // =
    const nameEnd = i;
    i += 1;
    const valueStart = i;
    while (i < text.length && !isValueEnd(text.charCodeAt(i))) i += 1;
    if (i > valueStart && isSecretName(text, nameStart, nameEnd) && text.slice(valueStart, i) !== REDACTED) {
      out.push(text.slice(copied, valueStart), REDACTED);
      copied = i;
    }
  }
  if (copied === 0) return text;
  out.push(text.slice(copied));
  return out.join('');
}

// --- Bearer tokens -------------------------------------------------------------------------------

/** RFC 6750's b64token characters: letters, digits and `-._~+/`, then any `=` padding. */
function isTokenCharacter(c: number): boolean {
  return isNameCharacter(c) || c === 0x7e || c === 0x2b || c === 0x2f || c === 0x3d; // ~ + / =
}

/** `Bearer <token>`, any case; a literal, so the scan cannot backtrack. */
const BEARER_SCHEME = /bearer/gi;

/**
 * The token after `Bearer` and at least one blank is hidden, to its first non-token character.
 * One forward scan: the scan resumes after each token, so no character is read twice.
 */
function redactBearerTokens(text: string): string {
  return hideValuesAfter(text, BEARER_SCHEME, (after) => {
    let i = after;
    while (i < text.length && SPACE.test(text[i]!)) i += 1;
    if (i === after) return undefined;
    const start = i;
    while (i < text.length && isTokenCharacter(text.charCodeAt(i))) i += 1;
    return { start, end: i, hide: i > start && text.slice(start, i) !== REDACTED };
  });
}

/**
 * The scan both key/value forms share: after each match of `keys`, `valueAt` says where the value
 * that follows runs, `[start, end)`, and whether to hide it (undefined: no value there); the scan
 * resumes after the value, so no character is read twice.
 */
function hideValuesAfter(
  text: string,
  keys: RegExp,
  valueAt: (afterKey: number) => { start: number; end: number; hide: boolean } | undefined,
): string {
  const out: string[] = [];
  let copied = 0;
  const scan = new RegExp(keys);
  for (let match = scan.exec(text); match; match = scan.exec(text)) {
    const value = valueAt(match.index + match[0].length);
    if (value === undefined) continue;
    if (value.hide) {
      out.push(text.slice(copied, value.start), REDACTED);
      copied = value.end;
    }
    scan.lastIndex = Math.max(value.end, scan.lastIndex);
  }
  if (copied === 0) return text;
  out.push(text.slice(copied));
  return out.join('');
}

// --- Keyword/value assignments ------------------------------------------------------------------

const SPACE = /[ \t]/;

function isBlank(c: string | undefined): boolean {
  return c === undefined || c === ' ' || c === '\t' || c === '\n' || c === '\r' || c === '\f' || c === '\v';
}

/** Where a quoted value that opens at `open` ends (after its closing quote), `\` escaping. */
function quotedEnd(text: string, open: number): number {
  const quote = text[open];
  for (let i = open + 1; i < text.length; i += 1) {
    if (text[i] === '\\') i += 1;
    else if (text[i] === quote) return i + 1;
  }
  // Unterminated: the rest of the text may all be the password.
  return text.length;
}

/**
 * A value redacted before, possibly followed by the quote that closed the text around it
 * (`DATABASE_URL="host=db password=***" is invalid`): redacting again must change nothing.
 */
const ALREADY_REDACTED = /^\*\*\*["']*$/;

/** A key ending in `password` or `passwd`, any case; a literal, so the scan cannot backtrack. */
const PASSWORD_KEY = /pass(?:word|wd)/gi;

function redactAssignments(text: string): string {
  return hideValuesAfter(text, PASSWORD_KEY, (after) => {
    let i = after;
    // A quoted key (`"password":`), then the separator with blanks around it.
    if (text[i] === '"' || text[i] === "'") i += 1;
    while (i < text.length && SPACE.test(text[i]!)) i += 1;
    if (text[i] !== '=' && text[i] !== ':') return undefined;
    i += 1;
    // libpq skips any whitespace after the '=', line breaks included: so does this.
    while (i < text.length && isBlank(text[i])) i += 1;
    const start = i;
    if (text[i] === "'" || text[i] === '"') i = quotedEnd(text, i);
    else while (i < text.length && !isBlank(text[i])) i += 1;
    return { start, end: i, hide: i > start && !ALREADY_REDACTED.test(text.slice(start, i)) };
  });
}
