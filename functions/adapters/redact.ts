/**
 * Removes credentials from free text (error messages included): `scheme://user:password@host`
 * keeps the user and loses the password, and token-like query parameters lose their values.
 */
// The password runs to the LAST '@' before the path: URL parsers accept a raw '@' in it, and
// stopping at the first one printed the rest of the password.
const URL_PASSWORD = /([a-z][a-z0-9+.-]*:\/\/[^\s:/@]*):[^\s/]+@/gi;
const SECRET_PARAMETER =
  /([?&](?:password|passwd|pwd|token|access_token|secret|api_key|apikey|key|sig|signature)=)[^&\s"']+/gi;
const PASSWORD_ASSIGNMENT = /(\bpassword\s*[=:]\s*)[^\s,;"']+/gi;

export function redactSecrets(text: string): string {
  if (!text.includes('://') && !text.includes('=') && !text.includes(':')) return text;
  return text
    .replace(URL_PASSWORD, '$1:***@')
    .replace(SECRET_PARAMETER, '$1***')
    .replace(PASSWORD_ASSIGNMENT, '$1***');
}
