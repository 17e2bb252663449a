/**
 * The local stand-in for Neon's WebSocket proxy: the Neon serverless driver opens a WebSocket
 * to `/v1?address=host:port`, and the bridge pipes its bytes to that PostgreSQL over TCP.
 * Only loopback targets are accepted, so the bridge can never be used to reach another host.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { connect } from 'node:net';
import { createWebSocketStream, WebSocketServer } from 'ws';
import { loopbackAddress } from '../../functions/adapters/loopback.ts';

export interface DatabaseBridge {
  readonly port: number;
  /** The value for `neonConfig.wsProxy`'s host part: `127.0.0.1:<port>`. */
  readonly address: string;
  close(): Promise<void>;
}

export { isLoopbackHost } from '../../functions/adapters/loopback.ts';

function parseTarget(requestUrl: string | undefined): { host: string; port: number } | undefined {
  const url = new URL(requestUrl ?? '/', 'http://bridge.invalid');
  const address = url.searchParams.get('address');
  if (!address) return undefined;
  const separator = address.lastIndexOf(':');
  const host = address.slice(0, separator);
  const port = Number(address.slice(separator + 1));
  // Connects to the address the name stands for, so `LOCALHOST` or `127.1` cannot be resolved
  // to anything but loopback by a resolver that thinks otherwise.
  const loopback = loopbackAddress(host);
  if (loopback === undefined || !Number.isInteger(port) || port <= 0 || port > 65535) return undefined;
  return { host: loopback, port };
}

export async function startDatabaseBridge(options: { port?: number } = {}): Promise<DatabaseBridge> {
  const server: Server = createServer((_request, response) => {
    response.writeHead(426, { 'content-type': 'text/plain' }).end('WebSocket upgrade required\n');
  });
  const sockets = new Set<import('node:net').Socket>();
  const wss = new WebSocketServer({ noServer: true });

  server.on('upgrade', (request, socket, head) => {
    const target = parseTarget(request.url);
    if (!target) {
      socket.end('HTTP/1.1 403 Forbidden\r\n\r\n');
      return;
    }
    wss.handleUpgrade(request, socket, head, (ws) => {
      const tcp = connect(target.port, target.host);
      tcp.setNoDelay(true);
      sockets.add(tcp);
      const stream = createWebSocketStream(ws);
      const finish = () => {
        sockets.delete(tcp);
        tcp.destroy();
        stream.destroy();
      };
      tcp.on('error', finish).on('close', finish);
      stream.on('error', finish).on('close', finish);
      stream.pipe(tcp).pipe(stream);
    });
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    address: `127.0.0.1:${port}`,
    async close() {
      for (const tcp of sockets) tcp.destroy();
      for (const client of wss.clients) client.terminate();
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
