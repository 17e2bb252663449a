/**
 * Why the LocalStack commands (`npm run deploy:local`, `npm run remove:local`, the local stage's
 * osls plugin) cannot go on. Each message is one line that says what is wrong and what to do;
 * `code` is stable.
 */
export abstract class LocalStackEmulatorError extends Error {
  abstract readonly code: string;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Nothing answers at the endpoint (refused, timed out, no such host). */
export class LocalStackUnreachableError extends LocalStackEmulatorError {
  readonly code = 'LOCALSTACK_UNREACHABLE';
}

/** Something answers at the endpoint, but not LocalStack (`npm run stack`'s SQS emulator, say). */
export class NotLocalStackError extends LocalStackEmulatorError {
  readonly code = 'NOT_LOCALSTACK';
}

/** LocalStack answers without a service the local stage needs. */
export class LocalStackServicesMissingError extends LocalStackEmulatorError {
  readonly code = 'LOCALSTACK_SERVICES_MISSING';
}

/** A step of the deployment (osls, the migrations) failed; it printed its own reason above. */
export class LocalStageStepError extends LocalStackEmulatorError {
  readonly code = 'LOCAL_STAGE_STEP_FAILED';
}
