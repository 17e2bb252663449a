import { describe, expect, it } from 'vitest';
import { translateDatabaseError } from '../../functions/adapters/database.ts';
import { DatabaseUnavailableError } from '../../functions/adapters/errors.ts';

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
});
