import { describe, expect, it } from 'vitest';
import { redactSecrets } from '../../functions/adapters/redact.ts';

/** Free text (error messages, dead-letter reasons) loses its credentials and keeps the rest. */
describe('redactSecrets', () => {
  it('hides the password of a URL and keeps the user, host and path', () => {
    expect(redactSecrets('connect failed: postgres://app:hunter2@db.internal:5432/app')).toBe(
      'connect failed: postgres://app:***@db.internal:5432/app',
    );
  });

  it('hides every password when the text holds several URLs', () => {
    const text = 'primary postgres://a:one@h1/db, replica postgres://b:two@h2/db';
    const redacted = redactSecrets(text);
    expect(redacted).not.toMatch(/one|two/);
    expect(redacted).toBe('primary postgres://a:***@h1/db, replica postgres://b:***@h2/db');
  });

  it('hides a password that itself contains an @, all of it', () => {
    const redacted = redactSecrets('dsn=postgres://app:p@ss@w0rd@db.internal/app failed');
    expect(redacted).not.toMatch(/p@ss|w0rd/);
    expect(redacted).toContain('postgres://app:***@db.internal/app');
  });

  it.each(['token', 'access_token', 'secret', 'api_key', 'apikey', 'key', 'sig', 'signature', 'pwd'])(
    'hides the value of a %s query parameter and keeps the other parameters',
    (name) => {
      const redacted = redactSecrets(`GET https://svc/x?id=7&${name}=abc123XYZ&page=2 failed`);
      expect(redacted).not.toContain('abc123XYZ');
      expect(redacted).toContain(`${name}=***`);
      expect(redacted).toContain('id=7');
      expect(redacted).toContain('page=2');
    },
  );

  it('hides a password query parameter (possibly with what follows it: hiding too much is safe)', () => {
    const redacted = redactSecrets('GET https://svc/x?id=7&password=abc123XYZ&page=2 failed');
    expect(redacted).not.toContain('abc123XYZ');
    expect(redacted).toContain('id=7&password=***');
  });

  it('hides password assignments in free text, whatever their case', () => {
    const redacted = redactSecrets('auth failed (password=hunter2, PASSWORD: letmein; user=app)');
    expect(redacted).not.toMatch(/hunter2|letmein/);
    expect(redacted).toContain('user=app');
  });

  it('leaves text without credentials unchanged, including URLs with a port and an @ in the path', () => {
    for (const text of [
      'provisioner answered 503',
      'GET http://127.0.0.1:8080/api/sandboxes/sbx-1?generation=2',
      'see https://host:8443/users/@alice for details',
      'ratio 3:4 at 10:30',
    ]) {
      expect(redactSecrets(text)).toBe(text);
    }
  });
});
