import { DatabaseAuthenticationError } from './errors.ts';

/**
 * For a DATABASE_URL without a password (right for a local PostgreSQL that trusts the login): a
 * password that refuses, for a server that asks for one anyway (Neon, RDS, any scram-sha-256 or
 * md5 hba line). Called by each driver's Client subclass right after the driver's own constructor.
 *
 * Both drivers keep a missing password as null, and then fail badly when the server asks: the Neon
 * driver's asynchronous SASL step threw "SASL: protocol error" / "client password must be a
 * string" as a rejection nobody handles, which ends the process (and the connect only ends at its
 * timeout); node-postgres first reads ~/.pgpass and then fails the connect with "SASL:
 * SCRAM-SERVER-FIRST-MESSAGE: client password must be a string", a message that names neither the
 * variable nor the fix. An empty string does not help: the Neon driver's WebCrypto refuses a
 * zero-length key the same way. So the password becomes the drivers' documented password callback,
 * asked when the server wants a password (or, in Neon's pipelined connect, up front), and it
 * refuses at once with DATABASE_AUTH_FAILED (which also makes a deployed function read its URL
 * again). A server that trusts the login never calls it. PGPASSWORD still applies (both drivers read
 * it first); ~/.pgpass is not consulted, and neither is used in deployment.
 */
export function refuseMissingPassword(client: object): void {
  const self = client as DriverClientInternals;
  if (typeof self.password === 'string' || typeof self.password === 'function') return;
  const user = String(self.user ?? '');
  self.password = () => {
    const error = new DatabaseAuthenticationError(
      `database asks for a password and DATABASE_URL has none for user ${JSON.stringify(user)}: put the password in the URL (postgres://user:password@host/db)`,
      { reason: 'no_password' },
    );
    closeOnceReported(self, error);
    const refusal = Promise.reject(error);
    // Marked handled: in Neon's pipelined connect (its default, deployed) the driver asks for
    // the password before the socket is open and only listens once it is; a connect that
    // fails first (a host that does not resolve) would leave this rejection unhandled, which
    // ends the process. The driver still sees the rejection when it does listen.
    refusal.catch(() => {});
    return refusal;
  };
}

/** What this module touches of both drivers' Client (node-postgres's fields, kept by Neon's fork). */
interface DriverClientInternals {
  password: unknown;
  user: unknown;
  connection?: {
    on(event: 'error', listener: (error: unknown) => void): unknown;
    off(event: 'error', listener: (error: unknown) => void): unknown;
  };
  end(): Promise<void>;
}

/**
 * Ends the client's connection once the driver has reported `error` (its connection emits it, and
 * the connect fails with it). Neither pool ends a client whose connect failed: the socket stayed
 * open, and the server kept a backend "starting" for it until authentication_timeout (60 s by
 * default; measured here with node-postgres). A function that retries its records would hold one
 * connection slot per attempt. Ended only after the report, so the connect fails with this error,
 * not with a "Connection terminated" of its own making.
 */
function closeOnceReported(client: DriverClientInternals, error: Error): void {
  const connection = client.connection;
  if (!connection) return;
  const onError = (reported: unknown) => {
    if (reported !== error) return;
    connection.off('error', onError);
    setImmediate(() => {
      client.end().catch(() => {});
    });
  };
  connection.on('error', onError);
}
