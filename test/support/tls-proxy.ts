import { readFileSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { TLSSocket } from 'node:tls';
import { fileURLToPath } from 'node:url';

/**
 * A TLS front for a PostgreSQL that has none (the machine's own and the embedded one run without
 * TLS): it speaks PostgreSQL's TLS negotiation itself — answers the client's SSLRequest with `S`,
 * completes the TLS handshake with a test certificate (test/fixtures/tls) — and pipes the
 * decrypted bytes to the real server. What a client sees is what RDS or any PostgreSQL with
 * `ssl = on` shows it: the same request, the same answer, a real certificate chain to verify.
 * A client that does not ask for TLS is refused the way `hostssl`-only servers refuse it.
 */
export interface TlsProxy {
  readonly port: number;
  /** TLS sessions completed so far (the handshake succeeded on both sides). */
  readonly tlsSessions: number;
  close(): Promise<void>;
}

export const TLS_FIXTURES = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
/** The CA that signed both test certificates: a URL's `sslrootcert`. */
export const TEST_CA_FILE = `${TLS_FIXTURES}ca.pem`;

/** `server`: valid for localhost and 127.0.0.1. `other-host`: for db.other.invalid only. */
export type TestCertificate = 'server' | 'other-host';

const SSL_REQUEST_CODE = 80877103;

/** An ErrorResponse with severity FATAL, SQLSTATE 28000, and a message. */
function fatal(message: string): Buffer {
  const fields = Buffer.concat(
    [`SFATAL`, `VFATAL`, `C28000`, `M${message}`].map((field) => Buffer.from(`${field}\0`, 'utf8')),
  );
  const body = Buffer.concat([fields, Buffer.from([0])]);
  const header = Buffer.alloc(5);
  header.write('E', 0, 'ascii');
  header.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([header, body]);
}

export async function startTlsProxy(options: {
  target: { host: string; port: number };
  certificate?: TestCertificate;
}): Promise<TlsProxy> {
  const name = options.certificate ?? 'server';
  const key = readFileSync(`${TLS_FIXTURES}${name}-key.pem`);
  const cert = readFileSync(`${TLS_FIXTURES}${name}.pem`);
  const sockets = new Set<Socket>();
  let tlsSessions = 0;
  const track = (socket: Socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
  };
  const server = createServer((client) => {
    track(client);
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      if (head.length < 8) return;
      client.off('data', onData);
      client.pause();
      if (head.readInt32BE(0) !== 8 || head.readInt32BE(4) !== SSL_REQUEST_CODE) {
        client.end(fatal('connection requires TLS (sslmode=disable is refused here)'));
        return;
      }
      client.write('S');
      const secure = new TLSSocket(client, { isServer: true, key, cert });
      track(secure);
      secure.once('secure', () => {
        tlsSessions += 1;
        const upstream = connect(options.target.port, options.target.host);
        track(upstream);
        for (const [a, b] of [
          [secure, upstream],
          [upstream, secure],
        ] as const) {
          a.on('close', () => b.destroy());
        }
        secure.pipe(upstream);
        upstream.pipe(secure);
      });
    };
    client.on('data', onData);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('the TLS proxy has no TCP address');
  return {
    port: address.port,
    get tlsSessions() {
      return tlsSessions;
    },
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
