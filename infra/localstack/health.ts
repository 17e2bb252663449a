/**
 * Is LocalStack there, with what the local stage needs? One GET of its health endpoint,
 * `/_localstack/health` (`{"services": {"sqs": "running" | "available" | "disabled", …}, "version": …}`),
 * bounded, so a deploy that cannot work says why in one line before it puts a parameter or starts
 * osls: nothing listening (start compose), something else listening (`npm run stack` serves SQS on
 * the same port 4566 and is not LocalStack), or a service disabled.
 */

import { LocalStackServicesMissingError, LocalStackUnreachableError, NotLocalStackError } from './errors.ts';
import { COMPOSE_FILE, LOCALSTACK_SERVICES } from './topology.ts';

const HEALTH_PATH = '/_localstack/health';
/** A local container answers at once; a bound keeps a black-holed address from hanging the deploy. */
const HEALTH_TIMEOUT_MS = 3_000;
/** `available`: ready, started on first use; `running`: started. Anything else cannot serve. */
const SERVING = new Set(['available', 'running']);

export interface LocalStackHealth {
  version: string | undefined;
  edition: string | undefined;
  services: Record<string, string>;
}

function causeOf(error: unknown): string {
  const cause = (error as { cause?: { code?: string; message?: string } })?.cause;
  return cause?.code ?? cause?.message ?? (error as Error)?.message ?? String(error);
}

export async function checkLocalStack(
  endpoint: string,
  options: { services?: readonly string[]; timeoutMs?: number } = {},
): Promise<LocalStackHealth> {
  const start = `start it with \`docker compose -f ${COMPOSE_FILE} up -d\` (needs Docker; docs/localstack.md), or set AWS_ENDPOINT_URL to where it listens`;
  let response: Response;
  try {
    response = await fetch(new URL(HEALTH_PATH, endpoint), {
      signal: AbortSignal.timeout(options.timeoutMs ?? HEALTH_TIMEOUT_MS),
    });
  } catch (error) {
    throw new LocalStackUnreachableError(
      `LocalStack is not reachable at ${endpoint} (${causeOf(error)}): ${start}`,
      { cause: error },
    );
  }
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {}
  const services = (body as { services?: unknown } | undefined)?.services;
  if (!response.ok || typeof services !== 'object' || services === null) {
    throw new NotLocalStackError(
      `${endpoint} answers, but not as LocalStack (GET ${HEALTH_PATH}: HTTP ${response.status}); is \`npm run stack\` (whose SQS emulator also listens on 4566) running there? Stop it, then ${start}`,
    );
  }
  const states = services as Record<string, string>;
  const missing = (options.services ?? LOCALSTACK_SERVICES).filter(
    (name) => !SERVING.has(states[name] ?? ''),
  );
  if (missing.length) {
    throw new LocalStackServicesMissingError(
      `LocalStack at ${endpoint} does not serve ${missing.map((name) => `${name} (${states[name] ?? 'absent'})`).join(', ')}: the local stage needs them; start it from ${COMPOSE_FILE}, whose SERVICES lists them`,
    );
  }
  const { version, edition } = body as { version?: string; edition?: string };
  return { version, edition, services: states };
}
