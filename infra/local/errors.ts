/**
 * Failures of the local stack's own parts (the embedded PostgreSQL, the local SQS endpoint) that a
 * person starting `npm start`, `npm run stack`, `npm test`, `npm run chaos` or `npm run bench`
 * meets first. Each message is one line that says what is wrong and what to do; `code` is stable.
 */
export abstract class LocalStackError extends Error {
  abstract readonly code: string;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

export function isLocalStackError(error: unknown): error is LocalStackError {
  return error instanceof LocalStackError;
}

/** The data folder's PostgreSQL belongs to another live process (another stack or demo). */
export class PostgresInUseError extends LocalStackError {
  readonly code = 'POSTGRES_IN_USE';
  constructor(
    readonly pid: number,
    readonly databaseDir: string,
  ) {
    super(
      `a PostgreSQL (pid ${pid}) already runs on ${databaseDir} for another running process (another stack or demo?); stop that first`,
    );
  }
}

/** The embedded PostgreSQL binaries cannot load: a shared library they link against is missing. */
export class PostgresLibraryMissingError extends LocalStackError {
  readonly code = 'POSTGRES_LIBRARY_MISSING';
  constructor(
    readonly binary: string,
    readonly library: string,
    readonly remedy: string,
  ) {
    super(
      `embedded PostgreSQL cannot start: ${binary} needs ${library}, which this machine lacks; ${remedy} (or set DATABASE_URL to a PostgreSQL of your own)`,
    );
  }
}

/**
 * Running as root, PostgreSQL runs as an unprivileged user, which must be able to reach its data
 * folder; no folder it can reach could be made.
 */
export class PostgresDataDirectoryError extends LocalStackError {
  readonly code = 'POSTGRES_DATA_DIRECTORY';
}

/** AWS_ENDPOINT_URL_SQS names an SQS endpoint that does not answer. */
export class SqsEndpointUnreachableError extends LocalStackError {
  readonly code = 'SQS_ENDPOINT_UNREACHABLE';
}

/** What a command prints when it cannot start: our one line for these, the stack for anything else (a bug). */
export function startupFailureText(error: unknown): string {
  if (isLocalStackError(error)) return error.message;
  return error instanceof Error ? (error.stack ?? error.message) : String(error);
}
