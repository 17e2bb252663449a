/**
 * What functions/adapters/database.ts needs of a driver: pg-pool's interface, which both drivers
 * implement (`@neondatabase/serverless` is a fork of node-postgres, and both pools are pg-pool).
 * Each driver module (database-neon.ts, database-tcp.ts) makes pools of this shape; everything
 * above it (bounds, retries, broken connections, credential rotation) is written once.
 */
export interface DriverResult {
  rows: unknown[];
  rowCount: number | null;
}

export interface DriverClient {
  /**
   * Without values: the simple-query protocol; a multi-statement text answers with an array of
   * results, one per statement.
   */
  query(text: string, values?: unknown[]): Promise<DriverResult>;
  /** Back to the pool; with an error, the connection is destroyed instead. */
  release(error?: Error): void;
  on(event: 'error', listener: (error: Error) => void): unknown;
}

export interface DriverPool {
  connect(): Promise<DriverClient>;
  /**
   * `'connect'`: a new client, before the pool hands it to anyone (pg-pool emits it synchronously,
   * between the connection's ReadyForQuery and the caller's callback). `'error'`: an idle client's
   * connection failed (the pool has discarded it already).
   */
  on(event: 'connect', listener: (client: DriverClient) => void): unknown;
  on(event: 'error', listener: (error: Error) => void): unknown;
  end(): Promise<void>;
}

export interface DriverPoolSettings {
  connectionString: string;
  max: number;
  idleTimeoutMillis: number;
  connectionTimeoutMillis: number;
}

export type DriverPoolFactory = (settings: DriverPoolSettings) => DriverPool;
