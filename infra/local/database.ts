import { type Database, type DatabaseOptions, openDatabase } from '../../functions/adapters/database.ts';
import { isLoopbackHost } from '../../functions/adapters/loopback.ts';
import { type DatabaseBridge, startDatabaseBridge } from './db-bridge.ts';

/**
 * Databases opened by the local entry points (CLIs, the stack, the demo, tests). The Neon driver
 * speaks WebSocket only, so a plain PostgreSQL is reached through the WebSocket bridge: the one
 * named by DATABASE_WS_PROXY, or, for a loopback URL, one started in this process on first use. A
 * remote URL (a Neon endpoint) goes through Neon's own proxy.
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

/** The bridge address to use for `url`, starting the in-process bridge when one is needed. */
export async function localWsProxy(url: string, configured?: string): Promise<string | undefined> {
  if (configured) return configured;
  if (!isLoopbackUrl(url)) return undefined;
  inProcessBridge ??= startDatabaseBridge();
  inProcessBridge.catch(() => {
    inProcessBridge = undefined;
  });
  return (await inProcessBridge).address;
}

/** `wsProxy`: DATABASE_WS_PROXY from the caller's configuration, if set. */
export async function openLocalDatabase(options: DatabaseOptions): Promise<Database> {
  const wsProxy = await localWsProxy(options.url, options.wsProxy);
  return openDatabase({ ...options, ...(wsProxy ? { wsProxy } : {}) });
}

/** Closes the bridge started on demand, if any (CLIs call this before they exit). */
export async function closeLocalBridge(): Promise<void> {
  const bridge = inProcessBridge;
  inProcessBridge = undefined;
  if (bridge) await (await bridge).close();
}
