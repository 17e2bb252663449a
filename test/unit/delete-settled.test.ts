import { describe, expect, it } from 'vitest';
import {
  CleanupTimeoutError,
  GenerationAnomalyError,
  ProvisionerBadResponseError,
  ProvisionerConnectionError,
  ProvisionerDeleteTimeoutError,
  ProvisionerRejectedError,
  ProvisionerUnavailableError,
  ReleaseLockTimeoutError,
} from '../../functions/cleanup/errors.ts';
import { deleteSettledBy } from '../../functions/cleanup/release-guard.ts';

/**
 * After a failed release attempt, may its in-flight record end at once? Only if the provisioner
 * can no longer act on the request: it was never sent, or the provisioner answered it with a
 * decision. A wrong "yes" would lift the scope's quarantine while a DELETE may still land.
 */
describe('deleteSettledBy', () => {
  it.each([
    ['the keyed lock timed out (never sent)', new ReleaseLockTimeoutError('lock')],
    ['409 naming an older generation', new GenerationAnomalyError('409 older', { currentGeneration: 1 })],
    ['a 4xx rejection', new ProvisionerRejectedError('403', { status: 403 })],
    [
      'an answer outside the contract with a 2xx status',
      new ProvisionerBadResponseError('html', { status: 200 }),
    ],
    ['a refused connection', new ProvisionerConnectionError('refused', { errorCode: 'ECONNREFUSED' })],
    ['a name that does not resolve', new ProvisionerConnectionError('dns', { errorCode: 'ENOTFOUND' })],
  ])('settles %s', (_, error) => {
    expect(deleteSettledBy(error)).toBe(true);
  });

  it.each([
    [
      'a 504 from a gateway whose upstream may still work',
      new ProvisionerUnavailableError('504', { status: 504 }),
    ],
    ['a 503', new ProvisionerUnavailableError('503', { status: 503 })],
    ['the whole release deadline', new CleanupTimeoutError('deadline')],
    ['the delete timeout', new ProvisionerDeleteTimeoutError('timeout')],
    ['a reset connection', new ProvisionerConnectionError('reset', { errorCode: 'ECONNRESET', reset: true })],
    [
      'a socket closed mid-request',
      new ProvisionerConnectionError('closed', { errorCode: 'UND_ERR_SOCKET' }),
    ],
    ['an error nobody classified', new Error('a bug')],
  ])('does not settle %s', (_, error) => {
    expect(deleteSettledBy(error)).toBe(false);
  });
});
