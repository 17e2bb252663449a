import { describe, expect, it } from 'vitest';
import { translateDatabaseError } from '../../functions/adapters/database.ts';
import {
  DatabaseAuthenticationError,
  DatabaseLockTimeoutError,
  DatabaseUnavailableError,
} from '../../functions/adapters/errors.ts';

/** The shape Node gives a socket's, resolver's or TLS failure (what the tcp driver rejects with). */
function systemError(code: string, message: string, fields: Record<string, unknown>): Error {
  return Object.assign(new Error(message), { code, ...fields });
}

/** The shape node-postgres (and Neon's fork of it) gives an ErrorResponse from the server. */
function serverError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code, severity: 'FATAL' });
}

describe('translateDatabaseError', () => {
  it('keeps the message of the WebSocket\'s ErrorEvent the driver rejects with (no Error, no "[object Object]")', () => {
    // The shape `ws` gives the Neon driver when the connection itself fails.
    const event = { type: 'error', message: 'getaddrinfo ENOTFOUND db.invalid', error: new Error('x') };
    const translated = translateDatabaseError(event);
    expect(translated).toBeInstanceOf(DatabaseUnavailableError);
    expect((translated as Error).message).toBe(
      'database connection failed: getaddrinfo ENOTFOUND db.invalid',
    );
  });

  it.each([
    ['EPIPE', 'write EPIPE', { errno: -32, syscall: 'write' }],
    ['EPERM', 'connect EPERM 10.0.0.5:5432', { errno: -1, syscall: 'connect' }],
    ['ECONNREFUSED', 'connect ECONNREFUSED 127.0.0.1:5432', { errno: -111, syscall: 'connect' }],
    ['ECONNRESET', 'read ECONNRESET', { errno: -104, syscall: 'read' }],
    ['ENOTFOUND', 'getaddrinfo ENOTFOUND db.example', { errno: -3008, syscall: 'getaddrinfo' }],
    ['EAI_AGAIN', 'getaddrinfo EAI_AGAIN db.example', { errno: -3001, syscall: 'getaddrinfo' }],
  ])(
    'maps the system error %s to DatabaseUnavailableError, even where its code looks like a SQLSTATE',
    (code, message, fields) => {
      // EPIPE and EPERM are five capitals, the shape of a SQLSTATE: they were passed through as
      // programming errors, so a socket that broke under a write failed its record for good.
      const translated = translateDatabaseError(systemError(code, message, fields));
      expect(translated).toBeInstanceOf(DatabaseUnavailableError);
      expect((translated as Error).message).toBe(`database connection failed: ${message}`);
      expect((translated as DatabaseUnavailableError).retryable).toBe(true);
    },
  );

  it.each([
    ['SELF_SIGNED_CERT_IN_CHAIN', 'self-signed certificate in certificate chain'],
    ['ERR_TLS_CERT_ALTNAME_INVALID', "Hostname/IP does not match certificate's altnames"],
    ['CERT_HAS_EXPIRED', 'certificate has expired'],
  ])('maps the TLS failure %s to DatabaseUnavailableError with its words', (code, message) => {
    const translated = translateDatabaseError(Object.assign(new Error(message), { code }));
    expect(translated).toBeInstanceOf(DatabaseUnavailableError);
    expect((translated as Error).message).toBe(`database connection failed: ${message}`);
  });

  it('maps the server’s answers by SQLSTATE, whichever driver carried them', () => {
    const terminated = translateDatabaseError(
      serverError('57P01', 'terminating connection due to administrator command'),
    );
    expect(terminated).toBeInstanceOf(DatabaseUnavailableError);
    expect((terminated as DatabaseUnavailableError).details.sqlstate).toBe('57P01');
    expect(
      translateDatabaseError(serverError('28P01', 'password authentication failed for user "app"')),
    ).toBeInstanceOf(DatabaseAuthenticationError);
    expect(
      translateDatabaseError(serverError('55P03', 'canceling statement due to lock timeout')),
    ).toBeInstanceOf(DatabaseLockTimeoutError);
    // A SQL error is the caller's, not the connection's: passed through as it is.
    const syntax = serverError('42601', 'syntax error at or near "SELEC"');
    expect(translateDatabaseError(syntax)).toBe(syntax);
  });
});
