/**
 * The middleware every function gets: Lambda context in every log line with keys reset between
 * invocations, and stored metrics flushed at the end with cold starts counted.
 */
import { injectLambdaContext } from '@aws-lambda-powertools/logger/middleware';
import { logMetrics } from '@aws-lambda-powertools/metrics/middleware';
import middy from '@middy/core';
import type { Context, SQSBatchResponse, SQSEvent } from 'aws-lambda';
import type { Telemetry } from './observability.ts';

export type SqsHandler = (event: SQSEvent, context: Context) => Promise<SQSBatchResponse>;

export function withObservability<E, R>(
  handler: (event: E, context: Context) => Promise<R>,
  telemetry: Telemetry,
) {
  return middy<E, R>()
    .use(injectLambdaContext(telemetry.logger, { resetKeys: true }))
    .use(logMetrics(telemetry.metrics, { captureColdStartMetric: true }))
    .handler((event: E, context: Context) => handler(event, context));
}

/**
 * The deployed entry point: builds the dependencies once per cold start (a failed build, e.g. bad
 * configuration, fails the invocation loudly and is retried on the next) and wires the handler.
 */
export function lambdaEntry<E, R>(
  build: () => Promise<{ handler: (event: E, context: Context) => Promise<R>; telemetry: Telemetry }>,
): (event: E, context: Context) => Promise<R> {
  let ready: Promise<(event: E, context: Context) => Promise<R>> | undefined;
  return async (event, context) => {
    if (!ready) {
      const building = build().then(({ handler, telemetry }) => withObservability(handler, telemetry));
      // A failed build is forgotten, so the next invocation builds again (not the same failure forever).
      building.catch(() => {
        if (ready === building) ready = undefined;
      });
      ready = building;
    }
    return (await ready)(event, context);
  };
}
