/** Base class for the local provisioner's own failures; `code` is stable, branch on it. */
export class ProvisionerError extends Error {
  override readonly name: string = 'ProvisionerError';
  readonly code: string;
  /** The HTTP status the API answers when this error reaches it. */
  readonly httpStatus: number;

  constructor(message: string, code: string, httpStatus: number, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.httpStatus = httpStatus;
  }
}

/** The provisioner is stopping; no new sandboxes are created. */
export class ProvisionerStoppingError extends ProvisionerError {
  override readonly name = 'ProvisionerStoppingError';
  constructor() {
    super('the provisioner is stopping', 'PROVISIONER_STOPPING', 503);
  }
}

/** The sandbox process could not be started. */
export class SandboxSpawnError extends ProvisionerError {
  override readonly name = 'SandboxSpawnError';
  readonly sandboxId: string;
  constructor(sandboxId: string, cause: unknown) {
    super(
      `could not start the process of sandbox ${JSON.stringify(sandboxId)}`,
      'SANDBOX_SPAWN_FAILED',
      500,
      {
        cause,
      },
    );
    this.sandboxId = sandboxId;
  }
}

/** A request was malformed; the message says which part and why. */
export class BadRequestError extends ProvisionerError {
  override readonly name = 'BadRequestError';
  constructor(message: string) {
    super(message, 'BAD_REQUEST', 400);
  }
}

/** A request body exceeded the size limit. */
export class BodyTooLargeError extends ProvisionerError {
  override readonly name = 'BodyTooLargeError';
  readonly limitBytes: number;
  constructor(limitBytes: number) {
    super(`request body exceeds ${limitBytes} bytes`, 'BODY_TOO_LARGE', 413);
    this.limitBytes = limitBytes;
  }
}
