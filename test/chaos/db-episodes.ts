/**
 * Database episodes that hit the whole stack at once, started by a run's plan (and forced by the
 * coverage cycle like any other kind):
 *
 * - a termination storm: every backend of the stack, and of a worker process that keeps 30
 *   connections busy with cleanup-shaped work through the real database adapter, terminated
 *   again and again for a while (what Neon sends as 57P01 when a compute suspends or restarts);
 *   it hits connects, open transactions, running statements and idle pooled clients alike
 *   (test/support/backend-storm.ts). The worker process is watched (process-watch.ts): a crash is
 *   invariant P's violation. The in-process stack meets the same storm; a crash there ends the
 *   chaos run itself.
 * - connects that never answer: the stack reaches the database through a TCP proxy that, for a
 *   while, accepts new connections and never answers them; the stack's idle connections are
 *   terminated at the start so its next statements must connect. Invariant T: each such connect
 *   is abandoned by its client within the connect timeout plus a margin — a connect that never
 *   answers must not consume an invocation's whole time.
 *
 * - REPEATABLE READ by default: the database's `default_transaction_isolation` set to
 *   'repeatable read' (ALTER DATABASE … SET), the stack's idle connections terminated so that it
 *   reconnects under it, for a while; then reset the same way. Nothing the stack decides may
 *   depend on the session's default (the reclaim guard once did: reclaimer bug 1); every
 *   invariant must hold through it.
 *
 * One episode of each kind at a time: a run whose plan asks while one is under way joins it.
 */
import type { Database } from '../../functions/adapters/database.ts';
import { startBackendStorm } from '../support/backend-storm.ts';
import type { ConnectStallingProxy } from '../support/stalling-proxy.ts';
import { preciseNow } from './clock.ts';
import { Invariant, type Violation } from './invariants.ts';
import type { WatchedProcess } from './process-watch.ts';

/** Backends terminated per storm before it counts as "across at least 30 connections". */
export const STORM_MIN_KILLS = 30;
/** Connections of the storm's targets open when it begins. */
export const STORM_MIN_CONNECTIONS = 30;
/** What a client may take beyond its connect timeout to close a connect that never answered. */
export const ABANDON_MARGIN_MS = 2_000;

const TERMINATE_IDLE = `
  SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int AS killed FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = $1::text AND state = 'idle'
    AND pid <> pg_backend_pid()`;

export interface StormReport {
  kills: number;
  /** Backends of the storm's targets connected when it began. */
  connectedAtStart: number;
}

const COUNT_TARGETS = `
  SELECT count(*)::int AS n FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = ANY ($1::text[]) AND pid <> pg_backend_pid()`;

/** The database's default isolation, for every new session (a superuser's or the owner's setting). */
const SET_DEFAULT_ISOLATION = `
  DO $$ BEGIN
    EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', current_database(), 'repeatable read');
  END $$`;
const RESET_DEFAULT_ISOLATION = `
  DO $$ BEGIN
    EXECUTE format('ALTER DATABASE %I RESET default_transaction_isolation', current_database());
  END $$`;
/** Stack backends that connected after the setting changed: they run under it. */
const STACK_CONNECTED_SINCE = `
  SELECT count(*)::int AS n FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = $1::text AND backend_start > $2::timestamptz
    AND pid <> pg_backend_pid()`;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

export class DatabaseEpisodes {
  readonly stormReports: StormReport[] = [];
  /**
   * Each episode from its start to the end of its effect (preciseNow): a storm's last kill; a
   * stall's end plus the connect timeout, by when every connect it stalled was given up.
   */
  readonly windows: Array<{ kind: 'storm' | 'stall'; startMs: number; endMs: number }> = [];
  #storm: Promise<StormReport> | undefined;
  #stall: Promise<number> | undefined;
  #repeatableRead: Promise<number> | undefined;

  constructor(
    private readonly admin: Database,
    /** application_name of every process the storm targets (the stack, the storm worker). */
    private readonly stormTargets: readonly string[],
    private readonly stackApplicationName: string,
    private readonly proxy: ConnectStallingProxy | undefined,
    private readonly connectTimeoutMs: number,
    /** Starts the storm's worker process (ready: its 30 workers connected). */
    private readonly startStormWorker: () => Promise<WatchedProcess>,
  ) {}

  /**
   * A storm of at least `ms`, going on past it (up to `deadlineMs`, preciseNow()) until
   * STORM_MIN_KILLS backends were terminated.
   */
  storm(ms: number, deadlineMs: number): Promise<StormReport> {
    this.#storm ??= this.#runStorm(ms, deadlineMs).finally(() => {
      this.#storm = undefined;
    });
    return this.#storm;
  }

  async #runStorm(ms: number, deadlineMs: number): Promise<StormReport> {
    const worker = await this.startStormWorker();
    const startMs = preciseNow();
    try {
      return await this.#terminateAll(ms, deadlineMs);
    } finally {
      this.windows.push({ kind: 'storm', startMs, endMs: preciseNow() });
      // Asked to stop: it prints its summary and exits 0, or 1 if it met a failure other than
      // "database unavailable" (invariant P reports either that or a crash).
      await worker.stop();
    }
  }

  async #terminateAll(ms: number, deadlineMs: number): Promise<StormReport> {
    // At least STORM_MIN_CONNECTIONS of its targets' connections open when it begins (up to 10 s).
    const connected = async () =>
      (await this.admin.query<{ n: number }>(COUNT_TARGETS, [[...this.stormTargets]])).rows[0]?.n ?? 0;
    const waitUntil = preciseNow() + 10_000;
    let connectedAtStart = await connected();
    while (connectedAtStart < STORM_MIN_CONNECTIONS && preciseNow() < waitUntil) {
      await sleep(100);
      connectedAtStart = await connected();
    }
    const storms = this.stormTargets.map((name) =>
      startBackendStorm(this.admin, name, { maxPauseMs: 25, maxVictims: 8 }),
    );
    const started = performance.now();
    const kills = () =>
      storms.reduce((sum, storm) => sum + Object.values(storm.kills).reduce((a, b) => a + b, 0), 0);
    while (performance.now() - started < ms || (kills() < STORM_MIN_KILLS && preciseNow() < deadlineMs)) {
      await sleep(50);
    }
    await Promise.all(storms.map((storm) => storm.stop().catch(() => {})));
    const report = { kills: kills(), connectedAtStart };
    this.stormReports.push(report);
    return report;
  }

  /**
   * New connects of the stack go unanswered for at least `ms`, and until one did (up to
   * `deadlineMs`); returns how many were stalled.
   */
  stallConnects(ms: number, deadlineMs: number): Promise<number> {
    this.#stall ??= this.#runStall(ms, deadlineMs).finally(() => {
      this.#stall = undefined;
    });
    return this.#stall;
  }

  async #runStall(ms: number, deadlineMs: number): Promise<number> {
    const proxy = this.proxy;
    if (!proxy) return 0;
    const before = proxy.stalledConnects.length;
    const startMs = preciseNow();
    proxy.stallNewConnections(true);
    try {
      const started = performance.now();
      // Its idle connections gone, the stack's next statements must connect.
      await this.admin.query(TERMINATE_IDLE, [this.stackApplicationName]);
      while (
        performance.now() - started < ms ||
        (proxy.stalledConnects.length === before && preciseNow() < deadlineMs)
      ) {
        await sleep(50);
        if (proxy.stalledConnects.length === before && performance.now() - started > ms / 2) {
          await this.admin.query(TERMINATE_IDLE, [this.stackApplicationName]);
        }
      }
    } finally {
      proxy.stallNewConnections(false);
      this.windows.push({ kind: 'stall', startMs, endMs: preciseNow() + this.connectTimeoutMs });
    }
    return proxy.stalledConnects.length - before;
  }

  /**
   * The database's default isolation REPEATABLE READ for at least `ms`, and until a stack backend
   * connected under it (up to `deadlineMs`), then for as long as `during` takes (a run with a
   * `during` of its own waits for the episode under way, then has its own; one without joins it); returns how many stack backends connected under it.
   * Reset afterwards whatever happens, and the stack made to reconnect again.
   */
  repeatableReadDefault(ms: number, deadlineMs: number, during?: () => Promise<unknown>): Promise<number> {
    if (during) {
      // A run with its own play under the setting queues behind the episode under way.
      const before = this.#repeatableRead?.catch(() => 0) ?? Promise.resolve(0);
      const mine: Promise<number> = before
        .then(() => this.#runRepeatableRead(ms, deadlineMs, during))
        .finally(() => {
          if (this.#repeatableRead === mine) this.#repeatableRead = undefined;
        });
      this.#repeatableRead = mine;
      return mine;
    }
    this.#repeatableRead ??= this.#runRepeatableRead(ms, deadlineMs).finally(() => {
      this.#repeatableRead = undefined;
    });
    return this.#repeatableRead;
  }

  async #runRepeatableRead(ms: number, deadlineMs: number, during?: () => Promise<unknown>): Promise<number> {
    const since = (await this.admin.query<{ now: Date }>('SELECT clock_timestamp() AS now')).rows[0]!.now;
    await this.admin.query(SET_DEFAULT_ISOLATION);
    const reconnected = async () =>
      (await this.admin.query<{ n: number }>(STACK_CONNECTED_SINCE, [this.stackApplicationName, since]))
        .rows[0]!.n;
    let connected = 0;
    try {
      const started = performance.now();
      await this.admin.query(TERMINATE_IDLE, [this.stackApplicationName]);
      while (performance.now() - started < ms || (connected === 0 && preciseNow() < deadlineMs)) {
        await sleep(100);
        connected = Math.max(connected, await reconnected());
        if (connected === 0 && performance.now() - started > ms / 2) {
          await this.admin.query(TERMINATE_IDLE, [this.stackApplicationName]);
        }
      }
      // What the run plays under the setting (a reclaim guard racing an admission), to its end.
      if (connected > 0) await during?.();
    } finally {
      await this.admin.query(RESET_DEFAULT_ISOLATION);
      await this.admin.query(TERMINATE_IDLE, [this.stackApplicationName]);
    }
    return connected;
  }

  /**
   * Waits until every stalled connect was given up by its client or is past the limit, so that
   * invariant T judges each one (bounded by the limit itself).
   */
  async awaitStalledConnectsJudgeable(): Promise<void> {
    const limitMs = this.connectTimeoutMs + ABANDON_MARGIN_MS;
    const open = () =>
      (this.proxy?.stalledConnects ?? []).some(
        (connect) => connect.closedAtMs === undefined && performance.now() - connect.acceptedAtMs < limitMs,
      );
    while (open()) await sleep(100);
  }

  /** Waits for the episodes under way (the engine's shutdown). */
  async settle(): Promise<void> {
    await Promise.allSettled([this.#storm, this.#stall, this.#repeatableRead]);
  }

  /**
   * Invariant T at `nowMs` (performance.now()): every stalled connect older than the connect
   * timeout plus the margin was closed by its client within that time.
   */
  judgeStalledConnects(nowMs: number): { violations: Violation[]; checked: number } {
    const violations: Violation[] = [];
    const limitMs = this.connectTimeoutMs + ABANDON_MARGIN_MS;
    let checked = 0;
    for (const [index, connect] of (this.proxy?.stalledConnects ?? []).entries()) {
      const waitedMs = (connect.closedAtMs ?? nowMs) - connect.acceptedAtMs;
      if (connect.closedAtMs === undefined && waitedMs < limitMs) continue;
      checked += 1;
      if (waitedMs <= limitMs) continue;
      violations.push({
        invariant: Invariant.CONNECT_ABANDONED,
        key: `T:${index}`,
        message: `a database connect that never answered was ${connect.closedAtMs === undefined ? 'still waited on' : 'given up'} after ${Math.round(waitedMs)} ms (connect timeout ${this.connectTimeoutMs} ms + ${ABANDON_MARGIN_MS} ms margin)`,
        details: { waitedMs: Math.round(waitedMs), closed: connect.closedAtMs !== undefined, limitMs },
      });
    }
    return { violations, checked };
  }
}
