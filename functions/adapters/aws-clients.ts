/**
 * Bounds for every AWS API call the functions and the local commands make (SQS, SSM). The SDK's
 * HTTP handler has no timeout by default: an endpoint that accepts the connection and never
 * answers (a stuck proxy, a half-dead emulator, a firewall that swallows packets after the
 * handshake) would hang a function until Lambda kills it, and `npm run ops` or `npm run stack`
 * forever. A healthy SQS or SSM answers in milliseconds, so the bounds are generous and fixed:
 *
 *   connection  AWS_CONNECT_TIMEOUT_MS   TCP (and TLS) connect
 *   request     AWS_REQUEST_TIMEOUT_MS   the whole request, until the answer has arrived
 *
 * With the SDK's 3 attempts a call that never gets an answer fails within about 3 × the request
 * timeout (plus the SDK's sub-second retry delays): 15 s, inside the shortest consumer function
 * timeout (30 s, infra/queues.json).
 */
export const AWS_CONNECT_TIMEOUT_MS = 2_000;
export const AWS_REQUEST_TIMEOUT_MS = 5_000;
export const AWS_MAX_ATTEMPTS = 3;

export interface AwsTimeouts {
  connectTimeoutMs: number;
  requestTimeoutMs: number;
}

export const DEFAULT_AWS_TIMEOUTS: AwsTimeouts = {
  connectTimeoutMs: AWS_CONNECT_TIMEOUT_MS,
  requestTimeoutMs: AWS_REQUEST_TIMEOUT_MS,
};

/**
 * The client options that bound every call. `throwOnRequestTimeout`: without it the SDK only
 * logs a warning when the request timeout passes and goes on waiting.
 */
export function boundedAwsClientOptions(timeouts: AwsTimeouts = DEFAULT_AWS_TIMEOUTS) {
  return {
    maxAttempts: AWS_MAX_ATTEMPTS,
    requestHandler: {
      connectionTimeout: timeouts.connectTimeoutMs,
      requestTimeout: timeouts.requestTimeoutMs,
      throwOnRequestTimeout: true,
    },
  };
}
