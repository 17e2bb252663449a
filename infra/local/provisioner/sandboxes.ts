import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ProvisionerStoppingError, SandboxSpawnError } from './errors.ts';
import type { SandboxInfo } from './types.ts';

/**
 * The sandbox's program: a shell that writes its pid to `ready`, then waits on its stdin, a pipe
 * whose other end only the provisioner holds. It exits when its parent is gone: a sandbox is not
 * detached, but a provisioner killed with SIGKILL (a crashed test runner) cannot kill its
 * children, and orphans would otherwise outlive every test run. The kernel closes the pipe with
 * the provisioner, whatever ended it, and `read` returns at once: nothing polls. A shell, not
 * Node: a test run starts about a thousand sandboxes, at some 30 ms of CPU each for Node against
 * 3 for the shell. The `ready` file tells a test that the program (and any signal trap) is
 * installed.
 */
const SANDBOX_SCRIPT = 'printf %s "$$" > ready; read -r _; exit 0';

/** The same program, but it ignores SIGTERM, to exercise the SIGKILL after the grace period. */
const STUBBORN_SANDBOX_SCRIPT = `trap '' TERM; ${SANDBOX_SCRIPT}`;

/**
 * The name of a sandbox's work directory: a readable, sanitised prefix of the id plus a hash
 * of the whole id and the generation. Only `[A-Za-z0-9_-]` survive, so no id (`../../etc`,
 * `/abs`, `a/b`, NUL…) can produce a separator or a dot-dot segment and escape the root; the
 * hash keeps ids that sanitise alike (`a/b`, `a?b`) apart.
 */
export function sandboxDirectoryName(sandboxId: string, generation: number): string {
  const readable = sandboxId.replace(/[^A-Za-z0-9_-]/g, '_').slice(0, 40);
  const digest = createHash('sha256').update(sandboxId, 'utf8').digest('hex').slice(0, 16);
  return `${readable}-${digest}-g${generation}`;
}

/** Whether a process with this pid exists (signal 0 checks without signalling). */
export function isProcessAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    // EPERM: it exists but belongs to someone else, which still means alive.
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

interface LiveSandbox {
  readonly id: string;
  readonly generation: number;
  readonly dir: string;
  readonly child: ChildProcess;
  readonly pid: number;
  readonly createdAt: number;
  readonly exited: Promise<void>;
}

/** The result of `SandboxRegistry.create`. */
export interface CreateResult {
  readonly created: boolean;
  readonly sandbox: SandboxInfo;
}

/** The result of `SandboxRegistry.delete`, one case per answer of contract §3. */
export type DeleteResult =
  | { readonly kind: 'deleted'; readonly generation: number }
  | { readonly kind: 'conflict'; readonly currentGeneration: number }
  | { readonly kind: 'not-found' };

export interface SandboxRegistryOptions {
  readonly rootDir: string;
  /** How long a sandbox gets between SIGTERM and SIGKILL. */
  readonly graceMs: number;
  readonly sandboxIgnoresSigterm: boolean;
}

/**
 * The live sandboxes and the generation history of every id. Every operation on one id runs
 * under that id's lock, so two DELETEs of the same sandbox never both kill it: the second
 * waits for the first and then finds nothing live (404), and a POST racing a DELETE creates
 * the next generation only after the old one is gone.
 */
export class SandboxRegistry {
  readonly #options: SandboxRegistryOptions;
  readonly #live = new Map<string, LiveSandbox>();
  readonly #lastGeneration = new Map<string, number>();
  readonly #locks = new Map<string, Promise<unknown>>();
  #stopping = false;

  constructor(options: SandboxRegistryOptions) {
    this.#options = options;
  }

  /** Returns the live sandbox unchanged, or creates the next generation of it. */
  create(sandboxId: string): Promise<CreateResult> {
    return this.#withLock(sandboxId, async () => {
      const existing = this.#live.get(sandboxId);
      if (existing) return { created: false, sandbox: describe(existing) };
      if (this.#stopping) throw new ProvisionerStoppingError();
      const generation = (this.#lastGeneration.get(sandboxId) ?? 0) + 1;
      // Consumed even if the spawn fails: generations only ever grow.
      this.#lastGeneration.set(sandboxId, generation);
      const sandbox = await this.#spawn(sandboxId, generation);
      this.#live.set(sandboxId, sandbox);
      return { created: true, sandbox: describe(sandbox) };
    });
  }

  /**
   * Deletes the live sandbox if its generation is `generation` (or whatever is live when
   * `generation` is undefined): SIGTERM, SIGKILL after the grace period, wait for the exit,
   * then remove the work directory.
   */
  delete(sandboxId: string, generation: number | undefined): Promise<DeleteResult> {
    return this.#withLock(sandboxId, async (): Promise<DeleteResult> => {
      const sandbox = this.#live.get(sandboxId);
      if (!sandbox) return { kind: 'not-found' };
      if (generation !== undefined && generation !== sandbox.generation) {
        return { kind: 'conflict', currentGeneration: sandbox.generation };
      }
      try {
        await this.#terminate(sandbox);
        await rm(sandbox.dir, { recursive: true, force: true });
      } finally {
        // The process is gone either way; keeping the record would report a dead sandbox as live.
        this.#live.delete(sandboxId);
      }
      return { kind: 'deleted', generation: sandbox.generation };
    });
  }

  get(sandboxId: string): SandboxInfo | undefined {
    const sandbox = this.#live.get(sandboxId);
    return sandbox && describe(sandbox);
  }

  list(): SandboxInfo[] {
    return [...this.#live.values()].map(describe);
  }

  /** Deletes every live sandbox; returns how many were deleted. */
  async deleteAll(): Promise<number> {
    const results = await Promise.all([...this.#live.keys()].map((id) => this.delete(id, undefined)));
    return results.filter((result) => result.kind === 'deleted').length;
  }

  /**
   * Refuses new sandboxes, lets operations already queued finish, then kills every sandbox
   * and waits for each process to exit. Nothing this registry started survives it.
   */
  async stop(): Promise<void> {
    this.#stopping = true;
    while (this.#locks.size > 0) await Promise.allSettled([...this.#locks.values()]);
    await this.deleteAll();
  }

  async #spawn(sandboxId: string, generation: number): Promise<LiveSandbox> {
    const dir = join(this.#options.rootDir, sandboxDirectoryName(sandboxId, generation));
    const createdAt = Date.now();
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'sandbox.json'), `${JSON.stringify({ sandboxId, generation, createdAt })}\n`);
    const script = this.#options.sandboxIgnoresSigterm ? STUBBORN_SANDBOX_SCRIPT : SANDBOX_SCRIPT;
    // stdin is the pipe the program waits on; nothing is ever written to it.
    const child = spawn('/bin/sh', ['-c', script], {
      cwd: dir,
      stdio: ['pipe', 'ignore', 'ignore'],
      detached: false,
    });
    // Registered before 'spawn' so an exit can never be missed.
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    try {
      await once(child, 'spawn');
    } catch (cause) {
      await rm(dir, { recursive: true, force: true });
      throw new SandboxSpawnError(sandboxId, cause);
    }
    // A failed kill is reported as an 'error' event; unheard, it would crash the provisioner. The
    // pipe's end is closed by the sandbox's exit, which is no error of the provisioner's either.
    child.on('error', () => {});
    child.stdin?.on('error', () => {});
    return { id: sandboxId, generation, dir, child, pid: child.pid!, createdAt, exited };
  }

  async #terminate(sandbox: LiveSandbox): Promise<void> {
    if (hasExited(sandbox.child)) return;
    sandbox.child.kill('SIGTERM');
    let graceTimer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<'grace-over'>((resolve) => {
      graceTimer = setTimeout(resolve, this.#options.graceMs, 'grace-over');
    });
    const first = await Promise.race([sandbox.exited, graceOver]);
    clearTimeout(graceTimer);
    if (first === 'grace-over') {
      sandbox.child.kill('SIGKILL');
      await sandbox.exited;
    }
  }

  #withLock<T>(sandboxId: string, operation: () => Promise<T>): Promise<T> {
    const previous = this.#locks.get(sandboxId) ?? Promise.resolve();
    const result = previous.then(operation, operation);
    const settled = result.then(
      () => undefined,
      () => undefined,
    );
    this.#locks.set(sandboxId, settled);
    void settled.then(() => {
      // Only the last operation queued for this id removes the lock entry.
      if (this.#locks.get(sandboxId) === settled) this.#locks.delete(sandboxId);
    });
    return result;
  }
}

function hasExited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

function describe(sandbox: LiveSandbox): SandboxInfo {
  return {
    id: sandbox.id,
    generation: sandbox.generation,
    pid: sandbox.pid,
    dir: sandbox.dir,
    alive: !hasExited(sandbox.child) && isProcessAlive(sandbox.pid),
    createdAt: sandbox.createdAt,
  };
}
