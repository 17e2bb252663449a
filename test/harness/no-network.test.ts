import { createServer } from 'node:http';
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { NetworkInUnitTestError } from '../support/no-network.ts';

/** The unit tier's promise (no database, no network) is kept by its setup file, shown here. */
describe('the unit tier opens no sockets', () => {
  it('refuses an outgoing connection, as a database or HTTP client would open', () => {
    expect(() => net.connect(5432, '127.0.0.1')).toThrow(NetworkInUnitTestError);
  });

  it('refuses to listen, as a local HTTP server or the SQS emulator would', () => {
    expect(() => createServer().listen(0, '127.0.0.1')).toThrow(NetworkInUnitTestError);
  });
});
