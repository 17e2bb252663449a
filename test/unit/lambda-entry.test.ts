import { describe, expect, it } from 'vitest';
import { lambdaEntry } from '../../functions/adapters/lambda.ts';
import { createTelemetry } from '../../functions/adapters/observability.ts';
import { localLambdaContext } from '../../infra/local/event-source.ts';

describe('the deployed entry point', () => {
  it('builds its dependencies once per cold start, and builds again after a failed build', async () => {
    let builds = 0;
    const telemetry = createTelemetry({ functionName: 'entry-test', logLevel: 'SILENT' });
    const handler = lambdaEntry(async () => {
      builds += 1;
      if (builds === 1) throw new Error('DATABASE_URL="" is invalid: is required in deployment');
      return { handler: async (event: { n: number }) => event.n * 2, telemetry };
    });
    const context = localLambdaContext('entry-test', 30);

    await expect(handler({ n: 1 }, context)).rejects.toThrow(/DATABASE_URL/);
    expect(await handler({ n: 2 }, context)).toBe(4);
    expect(await handler({ n: 3 }, context)).toBe(6);
    expect(builds).toBe(2);
  });
});
