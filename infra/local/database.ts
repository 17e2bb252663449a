import { type Database, type DatabaseOptions, openDatabase } from '../../functions/adapters/database.ts';
import { DatabaseDriver, databaseDriverFor } from '../../functions/adapters/database-driver.ts';
import { isLoopbackHost } from '../../functions/adapters/loopback.ts';
import { type DatabaseBridge, startDatabaseBridge } from './db-bridge.ts';

/**
 * Databases opened by the local entry points (CLIs, the stack, the demo, tests), with the driver
 * DATABASE_DRIVER names, else the one the URL's host calls for (`tcp` for a loopback URL). The Neon
 * driver speaks WebSocket only, so under `neon` a plain PostgreSQL is reached through the WebSocket
 * bridge: the one named by DATABASE_WS_PROXY, or, for a loopback URL, one started in this process
 * on first use. A remote URL (a Neon endpoint) goes through Neon's own proxy. Under `tcp` no bridge
 * is started and DATABASE_WS_PROXY is not used.
 *
 * This lives here and not in functions/adapters/database.ts so that the deployed bundles, which
 * are built from functions/, never contain the bridge (the template test inspects the zips).
 */
let inProcessBridge: Promise<DatabaseBridge> | undefined;

function isLoopbackUrl(url: string): boolean {
  try {
    return isLoopbackHost(new URL(url).hostname);
  } catch {
    return false;
  }
}

/** How a local entry point reaches `url`: the driver, and under `neon` the bridge, if one is needed. */
export interface LocalConnection {
  driver: DatabaseDriver;
  wsProxy?: string;
}

/** The bridge this process starts on first use and `closeLocalBridge` closes: its address. */
async function sharedBridge(): Promise<string> {
  inProcessBridge ??= startDatabaseBridge();
  inProcessBridge.catch(() => {
    inProcessBridge = undefined;
  });
  return (await inProcessBridge).address;
}

/**
 * The connection for `url` given the caller's DATABASE_DRIVER and DATABASE_WS_PROXY (either may be
 * unset): under `neon`, a loopback URL and no bridge configured, `startBridge` provides one (by
 * default the process's shared bridge; the stack starts one it owns and stops).
 */
export async function localConnection(
  url: string,
  configured: { driver?: DatabaseDriver | undefined; wsProxy?: string | undefined } = {},
  startBridge: () => Promise<string> = sharedBridge,
): Promise<LocalConnection> {
  const driver = databaseDriverFor(url, configured.driver);
  if (driver !== DatabaseDriver.NEON) return { driver };
  if (configured.wsProxy) return { driver, wsProxy: configured.wsProxy };
  if (!isLoopbackUrl(url)) return { driver };
  return { driver, wsProxy: await startBridge() };
}

/** `driver` and `wsProxy`: DATABASE_DRIVER and DATABASE_WS_PROXY from the caller's configuration, if set. */
export async function openLocalDatabase(options: DatabaseOptions): Promise<Database> {
  return openDatabase({ ...options, ...(await localConnection(options.url, options)) });
}

/** Closes the bridge started on demand, if any (CLIs call this before they exit). */
export async function closeLocalBridge(): Promise<void> {
  const bridge = inProcessBridge;
  inProcessBridge = undefined;
  if (bridge) await (await bridge).close();
}
