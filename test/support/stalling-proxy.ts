import { connect, createServer, type Server, type Socket } from 'node:net';

/**
 * Real TCP servers that model a database which stops answering, as a dead network path or a
 * stalled proxy looks from the client: bytes go out, nothing ever comes back, and no error either.
 *
 * - `startSilentServer`: accepts connections and never sends a byte (a PostgreSQL that never
 *   answers the startup, or, given as the WebSocket proxy, a proxy that never answers the upgrade).
 * - `startStallingProxy`: forwards to a real PostgreSQL until a connection's client sends a chosen
 *   marker (a run id inside a statement's parameters, say); from then on that one connection is a
 *   black hole in both directions, while every other connection keeps working.
 */
export interface SilentServer {
  readonly port: number;
  readonly address: string;
  /** Connections accepted so far. */
  readonly accepted: number;
  close(): Promise<void>;
}

export interface StallingProxy {
  readonly port: number;
  /** Connections that met a marker and went silent. */
  readonly stalled: number;
  /** From now on, a connection whose client sends `marker` stops being answered. */
  stallOn(marker: string): void;
  close(): Promise<void>;
}

async function listen(server: Server): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('server has no TCP address');
  return address.port;
}

async function closeAll(server: Server, sockets: Set<Socket>): Promise<void> {
  for (const socket of sockets) socket.destroy();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

export async function startSilentServer(): Promise<SilentServer> {
  const sockets = new Set<Socket>();
  let accepted = 0;
  const server = createServer((socket) => {
    accepted += 1;
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
  });
  const port = await listen(server);
  return {
    port,
    address: `127.0.0.1:${port}`,
    get accepted() {
      return accepted;
    },
    close: () => closeAll(server, sockets),
  };
}

export async function startStallingProxy(target: { host: string; port: number }): Promise<StallingProxy> {
  const sockets = new Set<Socket>();
  const markers: Buffer[] = [];
  let stalled = 0;
  const server = createServer((client) => {
    const upstream = connect(target.port, target.host);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => {
        sockets.delete(socket);
        client.destroy();
        upstream.destroy();
      });
    }
    let silent = false;
    // The tail of the previous chunk, so a marker split across two chunks is still seen.
    let tail = Buffer.alloc(0);
    client.on('data', (chunk: Buffer) => {
      if (!silent) {
        const seen = Buffer.concat([tail, chunk]);
        if (markers.some((marker) => seen.includes(marker))) {
          silent = true;
          stalled += 1;
        }
        tail = seen.subarray(Math.max(0, seen.length - 256));
      }
      if (!silent) upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (!silent) client.write(chunk);
    });
  });
  const port = await listen(server);
  return {
    port,
    get stalled() {
      return stalled;
    },
    stallOn(marker: string) {
      markers.push(Buffer.from(marker, 'utf8'));
    },
    close: () => closeAll(server, sockets),
  };
}

/** A connection the proxy accepted while stalling and never answered. */
export interface StalledConnect {
  readonly acceptedAtMs: number;
  /** When the client gave up on it (closed its end); undefined while it still waits. */
  closedAtMs: number | undefined;
}

export interface ConnectStallingProxy {
  readonly port: number;
  /** `127.0.0.1:<port>`, to be given where the real address was (a WebSocket proxy, say). */
  readonly address: string;
  /** Every connection accepted while stalling, oldest first. */
  readonly stalledConnects: readonly StalledConnect[];
  /** While on, new connections are accepted and never answered; earlier ones keep working. */
  stallNewConnections(on: boolean): void;
  close(): Promise<void>;
}

/**
 * A TCP proxy that forwards to `target` and, while told to stall, accepts new connections and
 * never answers them — not even after the stall ends — the way a connect looks across a dead
 * network path or to a compute that hangs mid-start: the TCP handshake succeeds, the startup
 * gets no reply, and no error ever comes. Only the client's own connect timeout ends such a
 * connection; the proxy records when it did.
 */
export async function startConnectStallingProxy(target: {
  host: string;
  port: number;
}): Promise<ConnectStallingProxy> {
  const sockets = new Set<Socket>();
  const stalledConnects: StalledConnect[] = [];
  let stalling = false;
  const server = createServer((client) => {
    sockets.add(client);
    client.on('error', () => {});
    if (stalling) {
      const stalled: StalledConnect = { acceptedAtMs: performance.now(), closedAtMs: undefined };
      stalledConnects.push(stalled);
      client.on('close', () => {
        stalled.closedAtMs = performance.now();
        sockets.delete(client);
      });
      // Read and drop whatever the client sends: it waits for an answer that never comes.
      client.resume();
      return;
    }
    const upstream = connect(target.port, target.host);
    sockets.add(upstream);
    upstream.on('error', () => {});
    for (const socket of [client, upstream]) {
      socket.on('close', () => {
        sockets.delete(socket);
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  const port = await listen(server);
  return {
    port,
    address: `127.0.0.1:${port}`,
    stalledConnects,
    stallNewConnections(on: boolean) {
      stalling = on;
    },
    close: () => closeAll(server, sockets),
  };
}
