/**
 * A real TCP proxy in front of PostgreSQL that models the one fault a retried write must survive:
 * the statement reaches the server and takes effect, and the connection dies before its answer
 * comes back (a Neon compute restarting, a proxy or NAT dropping the flow). Once armed, the first
 * connection whose client sends `marker` (a run id inside a statement's parameters) and then a
 * `COMMIT` has the COMMIT forwarded, and is cut as soon as the server answers it: the transaction
 * is committed, the client never hears so. Every other connection is forwarded untouched.
 */
import { connect, createServer, type Socket } from 'node:net';

export interface AnswerDroppingProxy {
  readonly port: number;
  /** COMMITs whose answer was dropped. */
  readonly dropped: number;
  dropCommitAnswerAfter(marker: string): void;
  close(): Promise<void>;
}

export async function startAnswerDroppingProxy(target: {
  host: string;
  port: number;
}): Promise<AnswerDroppingProxy> {
  const sockets = new Set<Socket>();
  let marker: Buffer | undefined;
  let dropped = 0;
  const COMMIT = Buffer.from('COMMIT', 'utf8');
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
    let sawMarker = false;
    let cutOnNextAnswer = false;
    client.on('data', (chunk: Buffer) => {
      if (marker && !sawMarker && chunk.includes(marker)) sawMarker = true;
      if (marker && sawMarker && chunk.includes(COMMIT)) {
        marker = undefined; // one-shot
        cutOnNextAnswer = true;
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (cutOnNextAnswer) {
        dropped += 1;
        client.destroy();
        upstream.destroy();
        return;
      }
      client.write(chunk);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('proxy has no TCP address');
  return {
    port: address.port,
    get dropped() {
      return dropped;
    },
    dropCommitAnswerAfter(text: string) {
      marker = Buffer.from(text, 'utf8');
    },
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
