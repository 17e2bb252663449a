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

/**
 * The Neon driver's Client, pointed at `wsProxy` (when given) by its OWN settings, not the
 * driver's process-wide `neonConfig`: two pools of one process with different bridges (a test's
 * silent proxy beside the suite's bridge) would otherwise both follow whichever was made last, and
 * a pool's next connect would go to the other one's address, closed or not. The password refuses
 * when the URL has none (missing-password.ts).
 */
function neonClientClass(wsProxy: string | undefined): typeof Client {
  return class NeonClient extends Client {
    constructor(config?: ConstructorParameters<typeof Client>[0]) {
      super(config);
      refuseMissingPassword(this);
      if (wsProxy) pointAtBridge(this.neonConfig, wsProxy);
    }
  };
}

/** Points a Neon client at a local bridge for loopback hosts; other hosts keep Neon's proxy. */
function pointAtBridge(config: Client['neonConfig'], wsProxy: string): void {
  config.wsProxy = (host, port) =>
    isLoopbackHost(host) ? `${wsProxy}/v1?address=${host}:${port}` : `${host}/v2`;
  config.useSecureWebSocket = false;
  config.pipelineTLS = false;
  // The default ('password') fails against trust and SCRAM auth on a plain PostgreSQL.
  config.pipelineConnect = false;
  // Coalescing costs about 1.3 ms per query on loopback, where there is no network to save.
  config.coalesceWrites = false;
}

/** `wsProxy`: `host:port` of a local WebSocket bridge; omitted in deployment (Neon's own proxy). */
export function neonPoolFactory(wsProxy: string | undefined): DriverPoolFactory {
  // The same for every pool of the process: Node has no global WebSocket the driver could use.
  neonConfig.webSocketConstructor = WebSocket as unknown as typeof neonConfig.webSocketConstructor;
  const NeonClient = neonClientClass(wsProxy);
  return (settings) => {
    const pool = new Pool(settings);
    // pg-pool's documented `Client` option, set after construction: the Neon pool's constructor
    // assigns its own Client class over the option.
    (pool as unknown as { Client: typeof Client }).Client = NeonClient;
    return pool as unknown as DriverPool;
  };
}
