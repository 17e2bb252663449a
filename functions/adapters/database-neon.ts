import { Client, neonConfig, Pool } from '@neondatabase/serverless';
import { WebSocket } from 'ws';
import type { DriverPool, DriverPoolFactory } from './database-pool.ts';
import { isLoopbackHost } from './loopback.ts';
import { refuseMissingPassword } from './missing-password.ts';

/**
 * The `neon` driver: `@neondatabase/serverless`'s Pool over WebSocket. Interactive transactions
 * (advisory locks, `FOR UPDATE`) need it: Neon's HTTP `neon()` function cannot hold a transaction
 * open.
 *
 * Locally no Neon proxy exists, so a WebSocket-to-TCP bridge stands in (`wsProxy`). The local
 * entry points start it and pass its address (infra/local/database.ts); nothing here imports it,
 * so no deployed bundle carries local-only code.
 */

/** The Neon driver's Client with a password that refuses when the URL has none (missing-password.ts). */
class NeonClient extends Client {
  constructor(config?: ConstructorParameters<typeof Client>[0]) {
    super(config);
    refuseMissingPassword(this);
  }
}

/** Points the Neon driver at a local bridge for loopback hosts; other hosts keep Neon's proxy. */
function configureDriver(wsProxy: string | undefined): void {
  neonConfig.webSocketConstructor = WebSocket as unknown as typeof neonConfig.webSocketConstructor;
  if (!wsProxy) return;
  neonConfig.wsProxy = (host, port) =>
    isLoopbackHost(host) ? `${wsProxy}/v1?address=${host}:${port}` : `${host}/v2`;
  neonConfig.useSecureWebSocket = false;
  neonConfig.pipelineTLS = false;
  // The default ('password') fails against trust and SCRAM auth on a plain PostgreSQL.
  neonConfig.pipelineConnect = false;
  // Coalescing costs about 1.3 ms per query on loopback, where there is no network to save.
  neonConfig.coalesceWrites = false;
}

/** `wsProxy`: `host:port` of a local WebSocket bridge; omitted in deployment (Neon's own proxy). */
export function neonPoolFactory(wsProxy: string | undefined): DriverPoolFactory {
  configureDriver(wsProxy);
  return (settings) => {
    const pool = new Pool(settings);
    // pg-pool's documented `Client` option, set after construction: the Neon pool's constructor
    // assigns its own Client class over the option.
    (pool as unknown as { Client: typeof Client }).Client = NeonClient;
    return pool as unknown as DriverPool;
  };
}
