/**
 * Takes over the process's stdout and stderr while the demo runs. The functions print their
 * structured JSON log lines and EMF metric lines there (as they do in Lambda, where CloudWatch
 * reads them); here every line goes to the log file and to the demo's listeners, and none
 * reaches the terminal, which belongs to the progress display. The demo writes its own output
 * through `terminal`, the original writers.
 *
 * Powertools' Logger and Metrics write through a `Console` built on `process.stdout` /
 * `process.stderr`; `Console` looks up `stream.write` on every call, so replacing the method
 * on the stream objects catches them (and the warnings Logger sends to stderr).
 */
import { once } from 'node:events';
import { createWriteStream, type WriteStream } from 'node:fs';

export interface CapturedLine {
  readonly stream: 'stdout' | 'stderr';
  readonly text: string;
  /** The parsed object when the line is a JSON object, else undefined. */
  readonly json: Record<string, unknown> | undefined;
}

export type LineListener = (line: CapturedLine) => void;

type Write = typeof process.stdout.write;

export interface Terminal {
  /** Writes to the real stdout. */
  out(text: string): void;
  /** Writes to the real stderr. */
  err(text: string): void;
}

export class OutputCapture {
  readonly terminal: Terminal;
  readonly #file: WriteStream;
  readonly #listeners = new Set<LineListener>();
  readonly #originals: { stdout: Write; stderr: Write };
  readonly #partial = { stdout: '', stderr: '' };
  #active = false;
  #lines = 0;
  #unparsed = 0;

  constructor(logPath: string) {
    this.#file = createWriteStream(logPath, { flags: 'a' });
    this.#originals = { stdout: process.stdout.write, stderr: process.stderr.write };
    const { stdout, stderr } = this.#originals;
    this.terminal = {
      out: (text) => void stdout.call(process.stdout, text),
      err: (text) => void stderr.call(process.stderr, text),
    };
    // A log file that cannot be written (disk full) must not crash the demo; say so once.
    this.#file.once('error', (error) =>
      this.terminal.err(`demo: cannot write ${logPath}: ${error.message}\n`),
    );
  }

  /** Lines seen so far, and how many of them were not JSON objects. */
  get counts(): { lines: number; unparsed: number } {
    return { lines: this.#lines, unparsed: this.#unparsed };
  }

  onLine(listener: LineListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  start(): void {
    if (this.#active) return;
    this.#active = true;
    process.stdout.write = this.#interceptor('stdout');
    process.stderr.write = this.#interceptor('stderr');
  }

  /** Puts the original writers back and flushes the log file; safe to call twice. */
  async stop(): Promise<void> {
    if (this.#active) {
      this.#active = false;
      process.stdout.write = this.#originals.stdout;
      process.stderr.write = this.#originals.stderr;
      for (const stream of ['stdout', 'stderr'] as const) {
        if (this.#partial[stream]) this.#emit(stream, this.#partial[stream]);
        this.#partial[stream] = '';
      }
    }
    if (!this.#file.writableEnded && !this.#file.destroyed) {
      this.#file.end();
      await once(this.#file, 'close');
    }
  }

  #interceptor(stream: 'stdout' | 'stderr'): Write {
    const capture = this;
    return function write(chunk: unknown, encodingOrCallback?: unknown, callback?: unknown): boolean {
      const text =
        typeof chunk === 'string'
          ? chunk
          : Buffer.from(chunk as Uint8Array).toString(
              typeof encodingOrCallback === 'string' ? (encodingOrCallback as BufferEncoding) : 'utf8',
            );
      capture.#accept(stream, text);
      const done = typeof encodingOrCallback === 'function' ? encodingOrCallback : callback;
      if (typeof done === 'function') process.nextTick(done as () => void);
      return true;
    } as Write;
  }

  #accept(stream: 'stdout' | 'stderr', text: string): void {
    const pieces = (this.#partial[stream] + text).split('\n');
    this.#partial[stream] = pieces.pop() ?? '';
    for (const piece of pieces) this.#emit(stream, piece);
  }

  #emit(stream: 'stdout' | 'stderr', text: string): void {
    if (text.trim() === '') return;
    this.#lines += 1;
    this.#file.write(`${text}\n`);
    const json = parseObject(text);
    if (!json) this.#unparsed += 1;
    const line: CapturedLine = { stream, text, json };
    for (const listener of this.#listeners) {
      try {
        listener(line);
      } catch (error) {
        // A display bug must not break the functions that happened to print the line.
        this.#file.write(`demo: line listener failed: ${(error as Error).stack ?? String(error)}\n`);
      }
    }
  }
}

function parseObject(text: string): Record<string, unknown> | undefined {
  if (!text.startsWith('{')) return undefined;
  try {
    const value: unknown = JSON.parse(text);
    return value !== null && typeof value === 'object' && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : undefined;
  } catch {
    return undefined;
  }
}
