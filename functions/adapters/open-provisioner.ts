import { requireProvisionerUrl } from './config.ts';
import type { Infrastructure } from './infrastructure.ts';
import { MetricName } from './metric-names.ts';
import type { Telemetry } from './observability.ts';
import { ProvisionerClient } from './provisioner-client.ts';

/**
 * The provisioner client of a function that calls the provisioner (release, reclaimer), as its
 * composition root builds it at cold start: SANDBOX_PROVISIONER_URL validated, the bearer token
 * read now from where the infrastructure keeps it (deployed: its SSM SecureString) and read again
 * by the client after a 401, and every DELETE refused because the base URL is not the provisioner
 * counted for its alarm (MetricName.PROVISIONER_URL_UNVERIFIED).
 */
export async function openProvisionerClient(
  infrastructure: Pick<Infrastructure, 'config' | 'provisionerToken'>,
  telemetry?: Telemetry,
): Promise<ProvisionerClient> {
  const url = requireProvisionerUrl(infrastructure.config);
  const source = infrastructure.provisionerToken();
  const token = source && {
    origin: source.origin,
    value: await source.current(),
    reread: () => source.reread(),
  };
  return new ProvisionerClient(url, {
    ...(token ? { token } : {}),
    ...(telemetry ? { onUrlUnverified: () => telemetry.count(MetricName.PROVISIONER_URL_UNVERIFIED) } : {}),
  });
}
