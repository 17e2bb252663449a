/**
 * Setup file of the unit tier: a unit test that opens a socket (a database, an HTTP server, the
 * SQS emulator) fails at that line, instead of passing here and failing on a machine without the
 * service, or slowing the tier down. Such a test belongs to the integration tier.
 */
import net from 'node:net';

export class NetworkInUnitTestError extends Error {
  constructor(what: string) {
    super(`unit tests open no sockets (${what}); a test that needs one belongs in test/integration`);
    this.name = 'NetworkInUnitTestError';
  }
}

net.Socket.prototype.connect = function refuseConnect(): never {
  throw new NetworkInUnitTestError('connect');
};
net.Server.prototype.listen = function refuseListen(): never {
  throw new NetworkInUnitTestError('listen');
};
